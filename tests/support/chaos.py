"""The chaos run: steady mixed load (streamed and plain chat, async jobs with webhooks)
while a runner, the frontdoor, the controller, the billing and webhook workers and Redis
are SIGKILLed in turn, each once `ebb up` brought the previous one back and the platform
served again without anyone touching it.

Every synchronous request the client made is classified by what the client saw:
  done         the full answer with its usage
  error_event  a stream that ended with an explicit `data: {"error": ...}` and [DONE]
  refused      429/503 with Retry-After (nothing done, nothing billed)
  transport    the connection broke (only a killed frontdoor may do that)
  bad          anything else: a 500, a stream cut silently, a 200 without usage...

Used by the integration test (tests/integration/test_chaos.py).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import psutil

from support import Platform, wait_until
from support.platform_processes import crash, pid_of, wait_replaced
from support.reliability import Submitter

KILL_ORDER = ("runner", "frontdoor", "coldstart", "billing", "webhooks", "redis")
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@dataclass
class Outcome:
    stream: bool
    ended: str  # done, error_event, refused, transport, bad
    phase: str  # the process being killed (or recovering) when the request ended
    request_id: str | None = None
    usage: dict | None = None
    detail: str = ""


class SyncLoad(threading.Thread):
    """One client making requests back to back (streamed or plain), recording outcomes."""

    def __init__(self, platform: Platform, key: str, model: str, *, stream: bool, chaos: Chaos):
        super().__init__(daemon=True)
        self._client = httpx.Client(
            base_url=platform.base_url, timeout=60, headers={"Authorization": f"Bearer {key}"}
        )
        self._model = model
        self._stream = stream
        self._chaos = chaos
        self.stop = threading.Event()
        self.outcomes: list[Outcome] = []

    def run(self) -> None:
        body = {"model": self._model, "messages": MESSAGES, "max_tokens": 24}
        if self._stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        while not self.stop.is_set():
            try:
                outcome = self._streamed(body) if self._stream else self._plain(body)
            except httpx.TransportError as e:
                outcome = Outcome(self._stream, "transport", "", detail=repr(e))
            outcome.phase = self._chaos.phase
            self.outcomes.append(outcome)
            if outcome.ended != "done":
                time.sleep(0.2)  # a refused client backs off, as its Retry-After asks
        self._client.close()

    def done(self) -> int:
        return sum(o.ended == "done" for o in self.outcomes)

    def _plain(self, body: dict) -> Outcome:
        response = self._client.post("/v1/chat/completions", json=body)
        rid = response.headers.get("X-Request-Id")
        if response.status_code == 200:
            return Outcome(False, "done", "", rid, response.json()["usage"])
        return _refusal(False, response, rid)

    def _streamed(self, body: dict) -> Outcome:
        with self._client.stream("POST", "/v1/chat/completions", json=body) as response:
            rid = response.headers.get("X-Request-Id")
            if response.status_code != 200:
                response.read()
                return _refusal(True, response, rid)
            lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        if not lines or lines[-1] != "[DONE]":
            return Outcome(True, "bad", "", rid, detail=f"cut silently after {lines[-3:]}")
        events = [json.loads(line) for line in lines[:-1]]
        errors = [e["error"] for e in events if "error" in e]
        if errors:
            return Outcome(True, "error_event", "", rid, detail=errors[0]["code"])
        usage = [e["usage"] for e in events if e.get("usage")]
        if not usage:
            return Outcome(True, "bad", "", rid, detail="no usage in the last chunk")
        return Outcome(True, "done", "", rid, usage[-1])


def _refusal(stream: bool, response: httpx.Response, rid: str | None) -> Outcome:
    try:
        code = response.json().get("error", {}).get("code", "")
    except ValueError:
        return Outcome(stream, "bad", "", rid, detail=f"{response.status_code} not JSON")
    if response.status_code in (429, 503) and response.headers.get("Retry-After"):
        return Outcome(stream, "refused", "", rid, detail=code)
    return Outcome(stream, "bad", "", rid, detail=f"{response.status_code} {code}")


@dataclass
class Chaos:
    platform: Platform
    phase: str = "steady"
    killed: dict[str, str] = field(default_factory=dict)

    def kill(self, role: str) -> None:
        """SIGKILL `role`; return once `ebb up` started a new one."""
        self.phase = role
        if role == "redis":
            old = redis_server_pid(self.platform)
            os.kill(old, signal.SIGKILL)
            new = wait_until(
                lambda: (pid := redis_server_pid(self.platform)) != old and pid, 30, "new redis"
            )
        elif role == "runner":
            old = pid_of(self.platform.home, "runner")
            os.kill(old, signal.SIGKILL)
            new = 0  # the controller launches another when the work asks for it
        else:
            old = crash(self.platform.home, role)
            new = wait_replaced(self.platform.home, role, old)
        self.killed[role] = f"{old}->{new or '?'}"


def redis_server_pid(platform: Platform) -> int:
    children = psutil.Process(platform.proc.pid).children()
    live = [c.pid for c in children if c.name() == "redis-server" and c.status() != "zombie"]
    return live[0] if live else 0


@dataclass
class Load:
    streams: SyncLoad
    plain: SyncLoad
    jobs: Submitter

    def start(self) -> None:
        for part in (self.streams, self.plain, self.jobs):
            part.start()

    def stop(self) -> None:
        for part in (self.streams, self.plain, self.jobs):
            part.stop.set()
            part.join(timeout=120)

    def served_again(self, timeout_s: float = 90) -> None:
        """Until streamed, plain and job traffic each got through again since now."""
        want = (self.streams.done() + 2, self.plain.done() + 2, len(self.jobs.ids) + 2)

        def progressed() -> bool:
            got = (self.streams.done(), self.plain.done(), len(self.jobs.ids))
            return all(g >= w for g, w in zip(got, want, strict=True))

        wait_until(progressed, timeout_s, "streamed, plain and job traffic to get through")

    @property
    def outcomes(self) -> list[Outcome]:
        return self.streams.outcomes + self.plain.outcomes


def run_chaos(platform: Platform, load: Load, chaos: Chaos) -> None:
    load.start()
    load.served_again()
    for role in KILL_ORDER:
        chaos.kill(role)
        load.served_again()
        chaos.phase = "steady"
    load.stop()


def summary(load: Load, chaos: Chaos) -> str:
    kinds = Counter((("stream" if o.stream else "plain"), o.ended) for o in load.outcomes)
    details = Counter(f"{o.ended}:{o.detail}@{o.phase}" for o in load.outcomes if o.ended != "done")
    return (
        f"sync={dict(kinds)} not_done={dict(details)} jobs={len(set(load.jobs.ids))} "
        f"job_submit_retries={load.jobs.retries} killed={chaos.killed}"
    )
