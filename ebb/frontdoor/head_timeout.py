"""A header-read timeout for uvicorn, which has none of its own.

A connection whose request head (request line and headers) is not complete within
EBB_HEADER_TIMEOUT_S of the connection opening, or of the next request's first byte, is
closed (h11: of the previous response's end): a client sending its head a byte at a time
(slowloris), or nothing at all, cannot hold connections open. Bodies are not timed here
(BodyGuard bounds their size; a route that waits on one learns of the disconnect).
`ebb.services.frontdoor` runs uvicorn with `HTTP_PROTOCOL`, the httptools protocol when
httptools is installed, else the h11 one.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from ebb.config import Settings


class _HeadTimer:
    """Closes `transport` unless `disarm()` runs within the timeout of `arm()`."""

    timeout_s: ClassVar[float | None] = None  # EBB_HEADER_TIMEOUT_S, read once per process

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: asyncio.Transport):
        self._loop = loop
        self._transport = transport
        self._handle: asyncio.TimerHandle | None = None

    @classmethod
    def _timeout(cls) -> float:
        if cls.timeout_s is None:
            cls.timeout_s = Settings().header_timeout_s
        return cls.timeout_s

    @property
    def armed(self) -> bool:
        return self._handle is not None

    def arm(self) -> None:
        self.disarm()
        self._handle = self._loop.call_later(self._timeout(), self._expire)

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _expire(self) -> None:
        self._handle = None
        if not self._transport.is_closing():
            self._transport.close()


class H11HeadTimeoutProtocol(H11Protocol):
    """h11: a head is complete when a request's cycle starts (`self.cycle` changes)."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._head_timer = _HeadTimer(self.loop, transport)
        self._head_timer.arm()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:
            self._head_timer.disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._head_timer.arm()  # the next request's head, or the keep-alive idle

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_timer.disarm()
        super().connection_lost(exc)


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is optional: uvicorn then parses with h11
    HTTP_PROTOCOL = "ebb.frontdoor.head_timeout:H11HeadTimeoutProtocol"
else:

    class HttpToolsHeadTimeoutProtocol(HttpToolsProtocol):
        """httptools: each request's head runs from its first byte to its last header."""

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._head_timer = _HeadTimer(self.loop, transport)
            self._head_timer.arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if not self._head_timer.armed:
                self._head_timer.arm()

        def on_headers_complete(self) -> None:
            self._head_timer.disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._head_timer.disarm()
            super().connection_lost(exc)

    HTTP_PROTOCOL = "ebb.frontdoor.head_timeout:HttpToolsHeadTimeoutProtocol"
