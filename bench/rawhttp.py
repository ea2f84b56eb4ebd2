"""A minimal HTTP/1.1 keep-alive client for admission benchmarks.

The load generator shares the machine's cores with the platform it measures; httpx
spends more CPU per request than the frontdoor does, so at hundreds of requests a second
the numbers were the client's. This sends one prebuilt request per call over a
persistent connection and reads a Content-Length response, nothing more (no chunked
bodies, no redirects): enough for non-streamed JSON answers and error responses.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit


class RawConnection:
    def __init__(self, base_url: str, headers: dict[str, str]):
        parts = urlsplit(base_url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    def request_bytes(self, path: str, body: object) -> bytes:
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n{self._headers}"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        return head.encode() + payload

    async def connect(self) -> None:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)

    async def send(self, request: bytes) -> tuple[int, bytes]:
        """(status, body); reconnects once when the server closed the connection."""
        for attempt in (0, 1):
            await self.connect()
            try:
                return await self._exchange(request)
            except (ConnectionError, asyncio.IncompleteReadError):
                await self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def _exchange(self, request: bytes) -> tuple[int, bytes]:
        assert self._reader is not None and self._writer is not None
        self._writer.write(request)
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, close = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        body = await self._reader.readexactly(length)
        if close:
            await self.close()
        return status, body

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._reader = None
