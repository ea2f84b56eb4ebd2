"""The header-read timeout (ebb.frontdoor.head_timeout) with either of uvicorn's HTTP
parsers: a connection whose request head stalls is closed; whole requests are served, also
several on one kept-alive connection."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import uvicorn
from support import free_port, wait_until

from ebb.frontdoor import head_timeout

PROTOCOLS = ["ebb.frontdoor.head_timeout:H11HeadTimeoutProtocol", head_timeout.HTTP_PROTOCOL]


async def _app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(params=PROTOCOLS, ids=["h11", "default"])
def server(request, monkeypatch) -> Iterator[int]:
    monkeypatch.setattr(head_timeout._HeadTimer, "timeout_s", 0.3)
    port = free_port()
    config = uvicorn.Config(
        _app, port=port, http=request.param, log_level="warning", lifespan="off"
    )
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    wait_until(lambda: instance.started, 10, "uvicorn to start")
    yield port
    instance.should_exit = True
    thread.join(10)


def test_a_stalled_head_is_closed(server):
    for partial in (b"", b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: a"):
        with socket.create_connection(("127.0.0.1", server), timeout=10) as sock:
            sock.sendall(partial)
            assert sock.recv(1024) == b"", partial  # closed, well before the 10 s timeout


def test_whole_requests_are_served_on_a_kept_alive_connection(server):
    with socket.create_connection(("127.0.0.1", server), timeout=10) as sock:
        for _ in range(2):
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b"ok"):
                piece = sock.recv(1024)
                assert piece, answer
                answer += piece
            assert answer.startswith(b"HTTP/1.1 200")
