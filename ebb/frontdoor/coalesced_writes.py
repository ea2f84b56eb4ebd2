"""A connection's writes of one event-loop turn, sent to its socket as one.

uvicorn writes a response's head and its body with two `transport.write` calls, made in
the same turn; each is a `send` system call of its own, which on this machine cost the
frontdoor more CPU than most of the Python that builds the response (about a fifth of it,
profiled under `bench.admission`). `CoalescedTransport` stands in for the connection's
transport: what is written in one turn is joined and written once, on the loop's next
turn (no waiting beyond that). Everything else is the transport's own; `close` sends what
is pending first, `abort` drops it, as the transport itself would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


class CoalescedTransport:
    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(bytes(data))

    def writelines(self, lines: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in lines:
            self.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        # Only what this class does not define: reading, extra info, is_closing, ...
        return getattr(self._transport, name)

    def _flush(self) -> None:
        if not self._pending:
            return  # sent by close() already
        pending, self._pending = self._pending, []
        if self._transport.is_closing():
            return  # the peer went away: the transport would drop it too
        self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))
