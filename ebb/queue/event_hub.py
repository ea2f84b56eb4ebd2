"""One XREAD for every request a frontdoor process follows, rather than one each.

Each admitted request waits on its own event stream, for its Claimed event and then for
its output. Read by a blocking XREAD per request, that is two or three round trips for a
one-token answer (each a pooled connection held while it blocks, and a socket write and
read on both sides): on this machine the largest part of the frontdoor's CPU for an
admitted request. Here one task reads the streams of all requests being followed with
one XREAD BLOCK and hands each its entries, so that requests in flight together share
their reads.

A request that starts being followed while that XREAD is blocked is not in it: the hub
sends CLIENT UNBLOCK to its connection, and the next XREAD names it. (Should its
connection have been replaced under it, by redis-py reconnecting, the XREAD still ends
within `_BLOCK_S`.) When the XREAD fails, every reader waiting on it raises that error,
as `EventReader.next` would, and the next `next` follows again from its last id.

`HubReader.next` keeps `EventReader.next`'s contract: events in order, repeats dropped
(`RepeatFilter`), None after `timeout_s` without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import deque
from typing import Any

import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.replies import reply_entries, reply_list, reply_text
from ebb.queue.requests import RepeatFilter, decode_entry
from ebb.queue.schema import Failed, Finished, RequestEvent

log = logging.getLogger(__name__)

# Entries read per stream per XREAD (a runner writes one per engine step).
_READ_BATCH = 256
# Longest one XREAD blocks: what a request followed while it blocks waits at worst, if
# CLIENT UNBLOCK misses (its connection replaced); while anything is followed, one read
# a second when nothing happens.
_BLOCK_S = 1.0


class HubReader:
    """One request's events, read through its process's `EventHub`."""

    def __init__(self, hub: EventHub, request_id: str):
        self._hub = hub
        self.key = keys.events(request_id)
        self.last_id = "0-0"
        self._buffer: deque[RequestEvent] = deque()
        self._repeats = RepeatFilter()
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None

    async def next(self, timeout_s: float) -> RequestEvent | None:
        """The next event, or None if none arrived within timeout_s."""
        if not self._buffer:
            self._waiter = asyncio.get_running_loop().create_future()
            self._hub.follow(self)
            try:
                async with asyncio.timeout(max(0.0, timeout_s)):
                    await self._waiter
            except TimeoutError:
                pass
            finally:
                self._waiter = None
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            if not self._buffer:
                return None
        event = self._buffer.popleft()
        if isinstance(event, Finished | Failed):
            self._hub.unfollow(self)  # a rerun after a Failed follows again
        return event

    def accept(self, entries: list[tuple[str, dict[bytes, bytes]]]) -> None:
        for entry_id, fields in entries:
            self.last_id = entry_id
            event = decode_entry(self.key, fields)
            if self._repeats.keep(event):
                self._buffer.append(event)
        if self._buffer:
            self._wake()

    def fail(self, error: BaseException) -> None:
        """The hub's read failed: a reader waiting on it raises `error`."""
        if self._waiter is not None:
            self._error = error
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class EventHub:
    """Follows the event streams of one process's requests with one XREAD at a time."""

    def __init__(self, client: aioredis.Redis):
        self._client = client  # for CLIENT UNBLOCK, from its pool
        self._followed: weakref.WeakValueDictionary[str, HubReader] = weakref.WeakValueDictionary()
        self._task: asyncio.Task[None] | None = None
        self._connection_id: int | None = None
        self._blocked = False  # an XREAD is on its way or blocking
        self._missing = False  # a reader followed since that XREAD was composed
        self._unblocking: asyncio.Task[None] | None = None

    def reader(self, request_id: str) -> HubReader:
        return HubReader(self, request_id)

    def follow(self, reader: HubReader) -> None:
        if self._followed.get(reader.key) is reader:
            return
        self._followed[reader.key] = reader
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._read_while_followed())
        elif self._blocked:
            self._missing = True
            if self._unblocking is None or self._unblocking.done():
                self._unblocking = asyncio.create_task(self._unblock())

    def unfollow(self, reader: HubReader) -> None:
        if self._followed.get(reader.key) is reader:
            del self._followed[reader.key]

    async def _read_while_followed(self) -> None:
        connection = aioredis.Redis(
            connection_pool=self._client.connection_pool, single_connection_client=True
        )
        try:
            self._connection_id = await connection.client_id()
            while self._followed:
                readers = dict(self._followed)
                streams: dict[Any, Any] = {key: r.last_id for key, r in readers.items()}
                self._missing = False
                self._blocked = True
                try:
                    reply = await connection.xread(
                        streams, count=_READ_BATCH, block=int(_BLOCK_S * 1000)
                    )
                finally:
                    self._blocked = False
                for stream, entries in _streams_of(reply):
                    reader = readers.get(stream)
                    if reader is not None:
                        reader.accept(reply_entries(entries))
        except Exception as e:  # Redis unavailable, most likely: the readers raise it
            for reader in list(self._followed.values()):
                reader.fail(e)
            self._followed.clear()
            if not isinstance(e, aioredis.RedisError | OSError):
                log.exception("queue: the event hub's read failed")
        finally:
            # Before anything else yields: a reader followed from now on starts a new task.
            self._task = None
            self._connection_id = None
            with contextlib.suppress(Exception):
                await connection.aclose()

    async def _unblock(self) -> None:
        """CLIENT UNBLOCK the XREAD until one that names every followed reader is sent."""
        while self._missing and self._blocked and self._connection_id is not None:
            try:
                await self._client.client_unblock(self._connection_id)
            except aioredis.RedisError:
                return  # the XREAD fails as well, or ends within _BLOCK_S
            await asyncio.sleep(0)  # its loop's turn to take the nil reply


def _streams_of(reply: object) -> list[tuple[str, object]]:
    """XREAD's reply (RESP2: [stream key, entries] pairs; nil when nothing came)."""
    return [(reply_text(pair[0]), pair[1]) for pair in map(reply_list, reply_list(reply or []))]
