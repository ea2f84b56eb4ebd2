"""The billing ledger in Redis: the raw usage streams, the consumer's cursors, the hourly
aggregates and the hour files waiting for export.

Raw records are append-only: token usage (one `UsageRecord` per finished request, written
by lua/finish.lua) and GPU segments (lua/meter_gpu.lua). The consumer folds them into
per-hour aggregates with lua/ledger_fold.lua and closes hours with lua/ledger_close.lua;
both check the state they were computed from, so concurrent or restarted consumers never
fold a record twice.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.metering import GpuSegment, HourClosed, decode_gpu_entry
from ebb.queue.replies import (
    reply_bytes,
    reply_entries,
    reply_hash,
    reply_int,
    reply_list,
    reply_text,
)
from ebb.queue.schema import UsageRecord
from ebb.queue.scripts import register_async

log = logging.getLogger(__name__)

START_ID = "0-0"
_usage_decoder = msgspec.json.Decoder(UsageRecord)


@dataclass(frozen=True)
class LedgerState:
    usage_cursor: str = START_ID  # last folded entry of the usage stream
    gpu_cursor: str = START_ID  # last folded entry of the GPU stream
    closed_through_ms: int | None = None  # None until the consumer first starts


@dataclass(frozen=True)
class RawRecord:
    """One raw entry; `record` is None when it could not be decoded."""

    stream: str  # "usage" or "gpu"
    entry_id: str
    record: UsageRecord | GpuSegment | HourClosed | None

    @property
    def entry_ms(self) -> int:
        return int(self.entry_id.partition("-")[0])


@dataclass(frozen=True)
class LedgerView:
    state: LedgerState
    aggregates: dict[int, dict[str, int]]  # {hour start ms: {"tenant|deployment|metric": n}}
    tail: list[RawRecord]  # raw records after the cursors: written, not folded yet
    tail_complete: bool  # False when more were waiting than were read


@dataclass(frozen=True)
class FoldResult:
    applied: bool
    folded: int = 0
    duplicates: int = 0


_STREAMS = {"usage": keys.USAGE, "gpu": keys.GPU_USAGE}
_STATE_FIELDS = ("usage_cursor", "gpu_cursor", "closed_through_ms")


class LedgerStore:
    def __init__(self, client: aioredis.Redis):
        self.redis = client
        self._fold = register_async(client, "ledger_fold")
        self._close = register_async(client, "ledger_close")
        self._trim = register_async(client, "ledger_trim")

    # --- consumer state ----------------------------------------------------------------

    async def state(self) -> LedgerState:
        return _state(await self.redis.hmget(keys.LEDGER_STATE, *_STATE_FIELDS))

    async def initialize(self, closed_through_ms: int) -> None:
        """Set where hour closing starts, unless a consumer did so before. The first value
        is kept apart: replaying the ledger from its start needs it."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hsetnx(keys.LEDGER_STATE, "closed_through_ms", str(closed_through_ms))
        pipe.hsetnx(keys.LEDGER_STATE, "initial_closed_through_ms", str(closed_through_ms))
        await pipe.execute()

    async def initial_closed_through_ms(self) -> int:
        raw = await self.redis.hget(keys.LEDGER_STATE, "initial_closed_through_ms")
        return int(raw) if raw else 0

    async def redis_now_ms(self) -> int:
        seconds, micros = await self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def first_entry_ms(self) -> int | None:
        """The time of the oldest raw entry in either stream."""
        found = []
        for stream in _STREAMS.values():
            first = reply_entries(await self.redis.xrange(stream, "-", "+", count=1))
            if first:
                found.append(int(first[0][0].partition("-")[0]))
        return min(found) if found else None

    # --- reading raw records -------------------------------------------------------------

    async def read(self, state: LedgerState, count: int, block_ms: int) -> list[RawRecord]:
        """Records after the cursors, up to `count` per stream, waiting up to block_ms."""
        reply = await self.redis.xread(
            {keys.USAGE: state.usage_cursor, keys.GPU_USAGE: state.gpu_cursor},
            count=count,
            block=block_ms or None,
        )
        records: list[RawRecord] = []
        for stream_reply in reply_list(reply or []):
            stream_key, entries = reply_list(stream_reply)
            name = "usage" if reply_text(stream_key) == keys.USAGE else "gpu"
            records += [
                _decode(name, entry_id, fields) for entry_id, fields in reply_entries(entries)
            ]
        return records

    async def scan(self, stream: str, upto_id: str, chunk: int = 1000) -> AsyncIterator[RawRecord]:
        """Every raw record of `stream` ("usage" or "gpu") from the start to `upto_id`."""
        start = "-"
        while upto_id != START_ID:
            entries = reply_entries(
                await self.redis.xrange(_STREAMS[stream], start, upto_id, count=chunk)
            )
            for entry_id, fields in entries:
                yield _decode(stream, entry_id, fields)
            if len(entries) < chunk:
                return
            start = "(" + entries[-1][0]

    # --- folding and closing -------------------------------------------------------------

    async def fold(
        self, state: LedgerState, usage_cursor: str, gpu_cursor: str, entries_json: bytes
    ) -> FoldResult:
        reply = await self._fold(
            keys=[keys.LEDGER_STATE, keys.LEDGER_HOURS],
            args=[
                state.usage_cursor,
                state.gpu_cursor,
                _closed_arg(state),
                usage_cursor,
                gpu_cursor,
                keys.LEDGER_AGG_PREFIX,
                keys.LEDGER_LINES_PREFIX,
                keys.LEDGER_SEEN_PREFIX,
                keys.LEDGER_SEEN_TTL_S,
                entries_json,
            ],
        )
        applied, folded, duplicates = (reply_int(n) for n in reply_list(reply))
        return FoldResult(bool(applied), folded, duplicates)

    async def close_hour(self, state: LedgerState, *, grace_ms: int, export: bool) -> str:
        """Close the oldest open hour: 'closed', or why not: 'early', 'behind', 'conflict'."""
        ok, detail = reply_list(
            await self._close(
                keys=[keys.LEDGER_STATE, keys.USAGE, keys.GPU_USAGE, keys.LEDGER_PENDING],
                args=[_closed_arg(state), grace_ms, HOUR_MS, keys.LEDGER_LINES_PREFIX, int(export)],
            )
        )
        return "closed" if reply_int(ok) else reply_text(detail)

    async def trim_usage(self, before_ms: int) -> tuple[int, int]:
        """Drop raw token records older than `before_ms` (an hour start) in closed and
        exported hours only (the script decides): (records removed, boundary in force)."""
        removed, boundary = reply_list(
            await self._trim(
                keys=[keys.LEDGER_STATE, keys.USAGE, keys.LEDGER_PENDING], args=[before_ms]
            )
        )
        return reply_int(removed), reply_int(boundary)

    async def usage_trimmed_ms(self) -> int:
        """Raw token records before this time (ms) were trimmed; 0: none ever were."""
        raw = await self.redis.hget(keys.LEDGER_STATE, "usage_trimmed_ms")
        return int(raw) if raw else 0

    # --- hour files ----------------------------------------------------------------------

    async def pending_exports(self) -> list[int]:
        return [reply_int(h) for h in await self.redis.zrange(keys.LEDGER_PENDING, 0, -1)]

    async def hour_lines(self, hour_ms: int) -> list[bytes]:
        return [
            reply_bytes(line) for line in await self.redis.lrange(keys.ledger_lines(hour_ms), 0, -1)
        ]

    async def mark_exported(self, hour_ms: int, sha256: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.LEDGER_EXPORTED, str(hour_ms), sha256)
        pipe.zrem(keys.LEDGER_PENDING, str(hour_ms))
        pipe.delete(keys.ledger_lines(hour_ms))
        await pipe.execute()

    async def exported(self) -> dict[int, str]:
        raw = reply_hash(await self.redis.hgetall(keys.LEDGER_EXPORTED))
        return {int(h): sha.decode() for h, sha in raw.items()}

    # --- aggregates ----------------------------------------------------------------------

    async def view(
        self, start_ms: int = 0, end_ms: int | None = None, *, tail_limit: int = 0
    ) -> LedgerView:
        """The aggregates of the hours in [start, end) and up to `tail_limit` raw records
        per stream not folded yet, read at one instant: every fold and close changes the
        state hash, so watching it is enough."""
        upper = f"({end_ms}" if end_ms is not None else "+inf"
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(keys.LEDGER_STATE)
                    state = _state(await pipe.hmget(keys.LEDGER_STATE, *_STATE_FIELDS))
                    found = await pipe.zrangebyscore(keys.LEDGER_HOURS, start_ms, upper)
                    hours = [reply_int(h) for h in found]
                    pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                    for hour in hours:
                        pipe.hgetall(keys.ledger_aggregates(hour))
                    if tail_limit:
                        pipe.xrange(keys.USAGE, "(" + state.usage_cursor, "+", count=tail_limit)
                        pipe.xrange(keys.GPU_USAGE, "(" + state.gpu_cursor, "+", count=tail_limit)
                    replies = await pipe.execute()
                    break
                except aioredis.WatchError:
                    continue
        counts = replies[: len(hours)]
        tail: list[RawRecord] = []
        for stream, entries in zip(("usage", "gpu"), replies[len(hours) :], strict=False):
            tail += [
                _decode(stream, entry_id, fields) for entry_id, fields in reply_entries(entries)
            ]
        return LedgerView(
            state=state,
            aggregates={
                hour: _counts(reply_hash(raw)) for hour, raw in zip(hours, counts, strict=True)
            },
            tail=tail,
            tail_complete=all(len(r) < tail_limit for r in replies[len(hours) :]),
        )

    async def aggregates(
        self, start_ms: int = 0, end_ms: int | None = None
    ) -> dict[int, dict[str, int]]:
        """{hour start ms: {"tenant|deployment|metric": n}} for hours in [start, end)."""
        return (await self.view(start_ms, end_ms)).aggregates


HOUR_MS = 3_600_000


def _state(raw: list[bytes | str | None]) -> LedgerState:
    usage, gpu, closed = (reply_text(v) if v else None for v in raw)
    return LedgerState(usage or START_ID, gpu or START_ID, int(closed) if closed else None)


def _counts(raw: dict[bytes, bytes]) -> dict[str, int]:
    return {field.decode(): int(value) for field, value in raw.items()}


def _closed_arg(state: LedgerState) -> str:
    return "" if state.closed_through_ms is None else str(state.closed_through_ms)


def _decode(stream: str, entry: str, fields: dict[bytes, bytes]) -> RawRecord:
    try:
        if stream == "usage":
            return RawRecord(stream, entry, _usage_decoder.decode(fields[b"r"]))
        return RawRecord(stream, entry, decode_gpu_entry(fields))
    except (KeyError, ValueError, msgspec.DecodeError):
        log.error("billing: undecodable %s ledger entry %s: %r", stream, entry, fields)
        return RawRecord(stream, entry, None)
