"""Steady client load on one deployment from a few threads, every outcome recorded: the
status, the version that served it (`x-ebb-version`) and, for streams, the time to the
first chunk. Half the workers stream. Used by the rollout tests and bench/rollout.py."""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass

import httpx

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@dataclass(frozen=True)
class Outcome:
    started_s: float  # time.monotonic()
    ok: bool
    status: int
    version: str
    ttft_s: float | None
    error: str = ""


class SteadyLoad:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        *,
        workers: int = 4,
        max_tokens: int = 8,
        route_keys: bool = True,
        timeout_s: float = 60,
    ):
        self._base_url = base_url
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._model = model
        self._workers = workers
        self._max_tokens = max_tokens
        self._route_keys = route_keys
        self._timeout_s = timeout_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.outcomes: list[Outcome] = []

    def __enter__(self) -> SteadyLoad:
        for i in range(self._workers):
            t = threading.Thread(target=self._work, args=(i % 2 == 1,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self._timeout_s + 10)

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)

    def failures(self) -> list[Outcome]:
        return [o for o in self.snapshot() if not o.ok]

    def since(self, started_s: float) -> list[Outcome]:
        return [o for o in self.snapshot() if o.started_s >= started_s]

    def _work(self, stream: bool) -> None:
        with httpx.Client(
            base_url=self._base_url, headers=self._headers, timeout=self._timeout_s
        ) as client:
            while not self._stop.is_set():
                outcome = self._one(client, stream)
                with self._lock:
                    self.outcomes.append(outcome)

    def _one(self, client: httpx.Client, stream: bool) -> Outcome:
        headers = {"x-ebb-route-key": uuid.uuid4().hex} if self._route_keys else {}
        body = {
            "model": self._model,
            "messages": MESSAGES,
            "max_tokens": self._max_tokens,
            "stream": stream,
        }
        started = time.monotonic()
        try:
            if not stream:
                r = client.post("/v1/chat/completions", json=body, headers=headers)
                ok = r.status_code == 200 and bool(r.json().get("choices"))
                version = r.headers.get("x-ebb-version", "")
                return Outcome(started, ok, r.status_code, version, None, "" if ok else r.text)
            return self._stream(client, body, headers, started)
        except httpx.HTTPError as e:
            return Outcome(started, False, 0, "", None, repr(e))

    def _stream(self, client: httpx.Client, body: dict, headers: dict, started: float) -> Outcome:
        with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            version = r.headers.get("x-ebb-version", "")
            if r.status_code != 200:
                r.read()
                return Outcome(started, False, r.status_code, version, None, r.text)
            ttft = None
            done = False
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    done = True
                    break
                if "error" in json.loads(data):
                    return Outcome(started, False, 200, version, ttft, data)
                ttft = ttft if ttft is not None else time.monotonic() - started
            return Outcome(started, done, 200, version, ttft, "" if done else "no [DONE]")
