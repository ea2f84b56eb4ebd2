"""The controller's handle on the fork server (ebb/runners/fork_server.py).

Requests go down the server's stdin; its answers (ready, spawned, exited) are read without
blocking whenever the launcher is asked something. Forked runners are the server's
children, not ours: it reaps them and reports their exits. Should the server itself die,
its runners notice their parent went and drain; they are then followed by pid until
they are gone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForkExit:
    runner_id: str
    code: int


class ForkServerClient:
    def __init__(self, env: dict[str, str], log_path: Path):
        with open(log_path, "ab") as log_file:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "ebb", "fork-server"],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
            )
        os.set_blocking(self._proc.stdout.fileno(), False)
        self._buffer = b""
        self._ready = False
        self._pending: set[str] = set()  # asked for, pid not reported yet
        self._pids: dict[str, int] = {}
        self._exits: list[ForkExit] = []

    def ready(self) -> bool:
        """The server has imported the engine and takes requests."""
        self._pump()
        return self._ready and self._proc.poll() is None

    def starting(self) -> bool:
        """The server is still importing the engine."""
        self._pump()
        return not self._ready and self._proc.poll() is None

    def spawn(self, runner_id: str, deployment: str | None, tier: str, log_path: Path) -> None:
        request = {
            "runner_id": runner_id,
            "deployment": deployment,
            "tier": tier,
            "log_path": str(log_path),
            "launched_ms": time.time() * 1000,
        }
        self._proc.stdin.write(json.dumps(request).encode() + b"\n")
        self._proc.stdin.flush()
        self._pending.add(runner_id)

    def poll(self) -> list[ForkExit]:
        """Runners that exited since the last call, each reported once."""
        self._pump()
        if self._proc.poll() is not None:
            self._follow_orphans()
        exits, self._exits = self._exits, []
        return exits

    def alive(self, runner_id: str) -> bool:
        self._pump()
        if runner_id in self._pending:
            return self._proc.poll() is None
        pid = self._pids.get(runner_id)
        return pid is not None and _pid_exists(pid)

    def signal(self, runner_id: str, sig: int) -> None:
        pid = self._pids.get(runner_id)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def runner_ids(self) -> list[str]:
        self._pump()
        return [*self._pending, *self._pids]

    def close(self, timeout_s: float = 10.0) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def _pump(self) -> None:
        try:
            chunk = self._proc.stdout.read()
        except (BlockingIOError, ValueError):
            chunk = None
        if not chunk:
            return
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            if line.strip():
                self._handle(json.loads(line))

    def _handle(self, event: dict) -> None:
        kind = event["event"]
        if kind == "ready":
            self._ready = True
            log.info("coldstart: the fork server is ready")
        elif kind == "spawned":
            self._pending.discard(event["runner_id"])
            self._pids[event["runner_id"]] = event["pid"]
        elif kind == "exited":
            self._pids.pop(event["runner_id"], None)
            self._exits.append(ForkExit(event["runner_id"], event["code"]))

    def _follow_orphans(self) -> None:
        """The server is gone: what it never forked failed; what it forked is followed by
        pid (draining on its own) and reported once it has exited."""
        if self._ready:
            log.warning("coldstart: the fork server exited with %s", self._proc.returncode)
            self._ready = False
        for runner_id in self._pending:
            self._exits.append(ForkExit(runner_id, -1))
        self._pending.clear()
        for runner_id, pid in list(self._pids.items()):
            if not _pid_exists(pid):
                del self._pids[runner_id]
                self._exits.append(ForkExit(runner_id, -1))


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
