"""The frontdoor's side of the queue: admit, watch, withdraw and cancel requests.

Output travels from runner to frontdoor through one Redis stream per request rather than
pub/sub: a stream keeps what was written before the reader started reading (the `Claimed`
event can land before the frontdoor's first XREAD), survives a reconnect of the reader
(it resumes from its last id), and expires with the request. Pub/sub would drop all of
that on the floor.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.connection import MAX_BLOCK_S
from ebb.queue.replies import reply_entries, reply_hash, reply_list
from ebb.queue.schema import (
    Claimed,
    Continued,
    Failed,
    Progress,
    RequestEvent,
    WorkItem,
    decode_event,
)
from ebb.queue.scripts import QueueScripts, TurnBatchLike

log = logging.getLogger(__name__)

# Events buffered per XREAD: a runner writes one per engine step.
_READ_BATCH = 256


class QueueFull(Exception):
    pass


class QueueShed(Exception):
    """A sheddable request refused: its queue already holds its shed depth."""


class RepeatFilter:
    """Drops Progress events seen before in one attempt (numbered by `seq`, which restarts
    with each Claimed event): a write retried across a Redis restart can land twice. Also
    drops Progress of a continuation the stream has moved past (`Progress.attempt` below
    the last `Continued`): a runner declared lost may still write for a while, and what
    it writes then was never part of the answer (the continuation replays the output up
    to its Continued event). Every reader of a request's events (the frontdoor's, a
    replay, the job collector, the continuation runner) keeps the same events."""

    def __init__(self) -> None:
        self._last_seq = 0
        self._attempt = 0

    def keep(self, event: RequestEvent) -> bool:
        if isinstance(event, Claimed):
            self._last_seq = 0
        elif isinstance(event, Continued):
            self._attempt, self._last_seq = event.attempt, 0
        elif isinstance(event, Progress):
            if event.attempt < self._attempt:
                return False
            if event.seq:
                if event.seq <= self._last_seq:
                    return False
                self._last_seq = event.seq
        return True


@dataclass(frozen=True)
class Admission:
    request_id: str
    deadline_ms: int


class RequestQueue:
    def __init__(
        self, client: aioredis.Redis, *, request_ttl_s: int, batch: TurnBatchLike | None = None
    ):
        """`batch`: enqueues join their loop turn's pipeline (`ebb.queue.turn_batch`)."""
        self._redis = client
        self._scripts = QueueScripts(client, batch)
        self._request_ttl_s = request_ttl_s

    async def enqueue(
        self, work: WorkItem, *, admission_window_s: float, depth_limit: int, shed_depth: int = 0
    ) -> Admission:
        """Queue `work`; raises QueueFull when the deployment's queue is at its limit,
        QueueShed when it holds `shed_depth` (> 0) requests already."""
        outcome = await self._scripts.enqueue(
            work,
            admission_window_ms=int(admission_window_s * 1000),
            depth_limit=depth_limit,
            request_ttl_s=self._request_ttl_s,
            shed_depth=shed_depth,
        )
        if outcome == "full":
            raise QueueFull(work.deployment)
        if outcome == "shed":
            raise QueueShed(work.deployment)
        if outcome == "duplicate":
            raise ValueError(f"request id {work.request_id} already exists")
        return Admission(work.request_id, outcome)

    async def withdraw(self, work: WorkItem) -> bool:
        """Take back a request nobody claimed; True means it will never run."""
        return await self._scripts.withdraw(work, state="withdrawn")

    async def rerun_lost(self, work: WorkItem, *, admission_window_s: float) -> bool:
        """Queue again a request its runner was lost with; False if it was not lost."""
        return await self._scripts.rerun_lost(
            work, admission_window_ms=int(admission_window_s * 1000)
        )

    async def cancel(self, work: WorkItem) -> str:
        """The client left: withdraw if queued, else have the runner abort it."""
        return await self._scripts.cancel(work)

    async def request_state(self, request_id: str) -> dict[str, str]:
        raw = reply_hash(await self._redis.hgetall(keys.request(request_id)))
        return {k.decode(): v.decode() for k, v in raw.items() if k != b"work"}

    async def ended_counts(self, request_id: str, wait_s: float) -> tuple[int, int] | None:
        """(prompt, completion) tokens the request's end recorded — the counts its usage
        record (the ledger) carries, written in the same step (finish.lua); (0, 0) for
        one withdrawn before it ran. None if it has not ended within `wait_s` (a
        cancelled one ends at its runner's next engine step)."""
        stream = keys.events(request_id)
        deadline = time.monotonic() + wait_s
        # Read from the stream's last entry: an end written after the state below is
        # read then shows up as a new entry, none is missed.
        last = reply_entries(await self._redis.xrevrange(stream, count=1))
        after = last[0][0] if last else "0-0"
        while True:
            state = await self.request_state(request_id)
            if state.get("state") not in ("queued", "claimed"):
                prompt, completion = state.get("prompt_tokens"), state.get("completion_tokens")
                return int(prompt or 0), int(completion or 0)
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return None
            block_ms = max(1, int(min(remaining_s, MAX_BLOCK_S) * 1000))
            reply = await self._redis.xread({stream: after}, count=_READ_BATCH, block=block_ms)
            if reply:
                _stream, entries = reply_list(reply_list(reply)[0])
                after = reply_entries(entries)[-1][0]

    async def depth(self, deployment: str) -> int:
        return await self._redis.zcard(keys.queue(deployment))

    def events(self, request_id: str) -> EventReader:
        return EventReader(self._redis, request_id)


class EventReader:
    """Reads one request's event stream in order, resuming from the last id seen."""

    def __init__(self, client: aioredis.Redis, request_id: str):
        self._redis = client
        self._key = keys.events(request_id)
        self._last_id = "0-0"
        self._buffer: list[RequestEvent] = []
        self._repeats = RepeatFilter()

    async def next(self, timeout_s: float) -> RequestEvent | None:
        """The next event, or None if none arrived within timeout_s."""
        deadline = time.monotonic() + timeout_s
        while not self._buffer:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return None
            block_ms = max(1, int(min(remaining_s, MAX_BLOCK_S) * 1000))
            reply = await self._redis.xread(
                {self._key: self._last_id}, count=_READ_BATCH, block=block_ms
            )
            if not reply:
                continue
            _stream, entries = reply_list(reply_list(reply)[0])
            for entry_id, fields in reply_entries(entries):
                self._last_id = entry_id
                event = decode_entry(self._key, fields)
                if self._repeats.keep(event):
                    self._buffer.append(event)
            self._buffer.reverse()
        return self._buffer.pop()


def decode_entry(stream: str, fields: dict[bytes, bytes]) -> RequestEvent:
    """One entry of a request's event stream; a malformed one is a Failed event (it must
    not hang the client)."""
    try:
        return decode_event(fields[b"e"])
    except Exception as e:
        log.exception("queue: undecodable event on %s", stream)
        return Failed(message=f"internal error: {e}", code="internal")
