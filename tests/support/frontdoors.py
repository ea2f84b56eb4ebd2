"""More frontdoors on one platform's Redis, and reading their SSE streams event by event:
what the frontdoor-restart tests and bench.frontdoor_roll share."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import httpx

from support import REPO_ROOT, Platform, free_port, wait_until


@dataclass
class Frontdoor:
    """One more `python -m ebb frontdoor` process on the platform's Redis."""

    proc: subprocess.Popen
    url: str
    log: IO[bytes]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout_s)
        self.log.close()
        return code

    def refuses_connections(self) -> bool:
        try:
            httpx.get(self.url + "/healthz", timeout=1)
        except httpx.ConnectError:
            return True
        except httpx.TransportError:
            return False
        return False


def start_frontdoor(platform: Platform, name: str, **env: str) -> Frontdoor:
    port = free_port()
    if platform.redis_url is None:  # `ebb up` started its own: run.json names it
        env = {
            "EBB_REDIS_URL": json.loads((platform.home / "run.json").read_text())["redis_url"],
            **env,
        }
    log = open(platform.home / f"frontdoor-{name}.log", "wb")  # noqa: SIM115 - closed in stop()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ebb", "frontdoor"],
        env={**platform.env(), "EBB_PORT": str(port), **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"frontdoor {name} exited: see {log.name}")
        try:
            return httpx.get(url + "/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(up, 60, f"frontdoor {name}")
    return Frontdoor(proc, url, log)


@dataclass
class SseEvent:
    id: str | None
    data: str
    fields: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.data)


def sse_events(response: httpx.Response) -> Iterator[SseEvent]:
    """The server-sent events of a streamed response, as they arrive."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if not line:
            if fields:
                yield SseEvent(fields.get("id"), fields.get("data", ""), fields)
            fields = {}
            continue
        name, _, value = line.partition(":")
        fields[name] = value.removeprefix(" ")
    if fields:
        yield SseEvent(fields.get("id"), fields.get("data", ""), fields)


def chat_text(events: list[SseEvent]) -> str:
    """The assistant text of a chat stream's chunk events."""
    text = []
    for event in events:
        if event.data == "[DONE]":
            continue
        for choice in event.json().get("choices", []):
            text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)
