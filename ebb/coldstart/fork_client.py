"""The controller's handle on the fork server (ebb/runners/fork_server.py).

Requests go down the server's stdin; its answers (ready, spawned, exited, or disabled with
the reason forking is unsafe there) are read without
blocking whenever the launcher is asked something. Forked runners are the server's
children, not ours: it reaps them and reports their exits. Should the server itself die,
its runners notice their parent went and drain, followed by pid until they are gone, and
a new server is started.
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
from typing import IO, Any

from ebb import backoff

log = logging.getLogger(__name__)

# A server that died is restarted after this, doubled for each death before it came up.
_RESTART_BACKOFF_S = 2.0
_RESTART_BACKOFF_MAX_S = 300.0


@dataclass(frozen=True)
class Exit:
    """A runner process that ended, with its exit code (negative: killed by that signal;
    -1 where nobody could collect it)."""

    runner_id: str
    code: int
    # Why, where the launcher knows more than the code (a pod's events and last log lines).
    detail: str = ""


SERVER_COMMAND = (sys.executable, "-m", "ebb", "fork-server")


class ForkServerClient:
    def __init__(
        self, env: dict[str, str], log_path: Path, command: tuple[str, ...] = SERVER_COMMAND
    ):
        self._env = env
        self._log_path = log_path
        self._command = command
        self._pending: set[str] = set()  # asked for, pid not reported yet
        self._pids: dict[str, int] = {}  # forked by the running server
        self._orphans: dict[str, int] = {}  # forked by a server that has died since
        self._exits: list[Exit] = []
        self._restarts = 0
        self._restart_at = 0.0
        self._closed = False
        # Why the server refused to fork (a CUDA context in it); it is not restarted then.
        self.disabled_reason = ""
        self._start()

    def _start(self) -> None:
        with open(self._log_path, "ab") as log_file:
            self._proc = subprocess.Popen(
                self._command,
                env=self._env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
            )
        self._stdin: IO[bytes] = _piped(self._proc.stdin)
        self._stdout: IO[bytes] = _piped(self._proc.stdout)
        os.set_blocking(self._stdout.fileno(), False)
        self._buffer = b""
        self._ready = False

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
        try:
            self._stdin.write(json.dumps(request).encode() + b"\n")
            self._stdin.flush()
        except OSError:
            # The server died since it said ready: this start failed (the controller backs
            # off and retries, spawning while the server is down).
            log.warning("coldstart: the fork server is gone; %s was not started", runner_id)
            self._exits.append(Exit(runner_id, -1))
            return
        self._pending.add(runner_id)

    def poll(self) -> list[Exit]:
        """Runners that exited since the last call, each reported once; a server that died
        is restarted (after a backoff that grows while it keeps dying)."""
        self._pump()
        if self._proc.poll() is not None and not self._closed and not self.disabled_reason:
            self._server_died()
        for runner_id, pid in list(self._orphans.items()):
            if not _pid_exists(pid):
                del self._orphans[runner_id]
                self._exits.append(Exit(runner_id, -1))
        exits, self._exits = self._exits, []
        return exits

    def alive(self, runner_id: str) -> bool:
        self._pump()
        if runner_id in self._pending:
            return self._proc.poll() is None
        pid = self.pid(runner_id)
        return pid is not None and _pid_exists(pid)

    def signal(self, runner_id: str, sig: int) -> None:
        pid = self.pid(runner_id)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def server_pid(self) -> int | None:
        """The fork server's own process id while it runs."""
        proc = getattr(self, "_proc", None)
        return proc.pid if proc is not None and proc.poll() is None else None

    def pid(self, runner_id: str) -> int | None:
        """The runner's process id, once the server has reported the fork."""
        self._pump()
        return self._pids.get(runner_id) or self._orphans.get(runner_id)

    def runner_ids(self) -> list[str]:
        self._pump()
        return [*self._pending, *self._pids, *self._orphans]

    def close(self, timeout_s: float = 10.0) -> None:
        self._closed = True
        if self._proc.poll() is None:
            self._stdin.close()
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def _pump(self) -> None:
        try:
            chunk = self._stdout.read()
        except (BlockingIOError, ValueError):
            chunk = None
        if not chunk:
            return
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            if line.strip():
                self._handle(json.loads(line))

    def _handle(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "ready":
            self._ready = True
            self._restarts = 0
            log.info("coldstart: the fork server is ready")
        elif kind == "spawned":
            self._pending.discard(event["runner_id"])
            self._pids[event["runner_id"]] = event["pid"]
        elif kind == "exited":
            self._pids.pop(event["runner_id"], None)
            self._exits.append(Exit(event["runner_id"], event["code"]))
        elif kind == "disabled":
            self.disabled_reason = event["reason"]
            log.warning("coldstart: forked starts are off on this host: %s", event["reason"])

    def _server_died(self) -> None:
        """What it never forked failed; what it forked drains on its own (its parent went)
        and is followed by pid until it has exited. Then, in time, a new server."""
        if self._restart_at == 0.0:
            log.warning("coldstart: the fork server exited with %s", self._proc.returncode)
            for runner_id in self._pending:
                self._exits.append(Exit(runner_id, -1))
            self._pending.clear()
            self._orphans.update(self._pids)
            self._pids.clear()
            self._restart_at = time.monotonic() + backoff.delay_s(
                self._restarts + 1, first_s=_RESTART_BACKOFF_S, cap_s=_RESTART_BACKOFF_MAX_S
            )
        elif time.monotonic() >= self._restart_at:
            self._restarts += 1
            self._restart_at = 0.0
            log.info("coldstart: restarting the fork server")
            self._start()


def _piped(stream: IO[bytes] | None) -> IO[bytes]:
    if stream is None:  # Popen gives the pipe it was asked for
        raise RuntimeError("the fork server was started without a pipe")
    return stream


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
