"""A webhook receiver for tests: a real HTTP server on 127.0.0.1 that records every request.

It can refuse the first N attempts of each webhook id (503), or everything while `down`,
to drive the platform's retries; it answers 200 otherwise.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATH = "/hooks/ebb"


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]

    @property
    def payload(self) -> dict:
        return json.loads(self.body)

    @property
    def job_id(self) -> str:
        return self.payload["data"]["id"]

    @property
    def event(self) -> str:
        return self.payload["type"]


@dataclass
class Receiver:
    fail_first: int = 0  # refuse this many attempts of each webhook id
    down: bool = False  # refuse everything
    answer_after: threading.Event | None = None  # hold every answer until this is set
    received: list[Received] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                if "webhook-id" not in headers or self.path != PATH:
                    # Not a delivery (another process on this machine found the port).
                    status = 404
                else:
                    status = receiver._answer(headers["webhook-id"])
                    receiver._hold()
                    with receiver._lock:
                        receiver.received.append(Received(headers, body, status))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}{PATH}"

    def _hold(self) -> None:
        if self.answer_after is None:
            return
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.answer_after.wait(30)
        with self._lock:
            self.in_flight -= 1

    def _answer(self, webhook_id: str) -> int:
        if self.down:
            return 503
        with self._lock:
            seen = sum(r.webhook_id == webhook_id for r in self.received)
        return 503 if seen < self.fail_first else 200

    def accepted(self, job_id: str | None = None, event: str | None = None) -> list[Received]:
        """Deliveries answered 2xx, optionally for one job and event type."""
        with self._lock:
            rows = list(self.received)
        return [
            r
            for r in rows
            if r.status == 200
            and (job_id is None or r.job_id == job_id)
            and (event is None or r.event == event)
        ]

    def attempts(self, webhook_id: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.webhook_id == webhook_id]
