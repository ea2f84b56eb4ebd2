"""The redis-server that `ebb up` runs when EBB_REDIS_URL is unset: password, start, watch.

Contract: the server listens on 127.0.0.1 on one port for its whole life (the URL every
child got stays right across restarts), requires a password generated once and kept in
EBB_HOME/redis_password (mode 0600; the URL carries it, nothing prints it), keeps its data
in an append-only file under EBB_HOME/redis, runs with a `maxmemory` (EBB_REDIS_MAXMEMORY_BYTES)
and `noeviction`, and is restarted with backoff when it dies.

The configuration, password included, reaches redis-server on its standard input
(`redis-server -`), never on its command line, which any local user can read with `ps`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import redis

from ebb import backoff
from ebb.config import Settings
from ebb.home import new_secret

PASSWORD_FILE = "redis_password"
# A crash right after a restart doubles the wait before the next one, up to this.
_RESTART_BACKOFF_MAX_S = 10.0
_RESTART_BACKOFF_FIRST_S = 0.25
# Up this long, a server's earlier crashes are forgotten: the next restart is immediate.
_STABLE_AFTER_S = 30.0
_START_TIMEOUT_S = 30.0


def free_port(*, avoid: Collection[int] = ()) -> int:
    """A port nothing listens on now, never one of `avoid`: ports this platform binds only
    later (the frontdoor's), which the kernel would hand out as free until then."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port


def maxmemory_bytes(setting: int | None) -> int:
    """The embedded Redis's maxmemory: the setting, or (unset) a quarter of the host's RAM,
    leaving room for the engines, the frontdoors and the copy an AOF rewrite's fork makes."""
    if setting is not None:
        return setting
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4


def redis_password(home: Path) -> str:
    """The embedded Redis's password, generated once under `home` with mode 0600."""
    path = home / PASSWORD_FILE
    if path.exists():
        return path.read_text().strip()
    home.mkdir(parents=True, exist_ok=True)
    password = new_secret("")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    return password


@dataclass
class EmbeddedRedis:
    settings: Settings
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    _started_s: float = 0.0
    _next_start_s: float = 0.0

    def __post_init__(self) -> None:
        # The frontdoor binds its port after Redis is up: Redis must not take it first.
        self.port = self.port or free_port(avoid={self.settings.port})
        self._password = redis_password(self.settings.home)

    @property
    def url(self) -> str:
        return f"redis://:{quote(self._password, safe='')}@127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.settings.logs_dir / "redis.log"

    def config(self) -> str:
        """redis.conf lines (password included): for redis-server's standard input only."""
        lines = {
            "port": str(self.port),
            "bind": "127.0.0.1",
            "protected-mode": "yes",
            "requirepass": self._password,
            "dir": str(self.settings.redis_dir.resolve()),
            "appendonly": "yes",
            # "always": an answer a client got (a finished request's usage, an accepted
            # job) is on disk before the reply leaves, so a SIGKILL loses nothing that
            # was acknowledged. Redis groups the fsyncs of one event-loop turn.
            "appendfsync": self.settings.redis_appendfsync,
            "save": '""',
            # Past maxmemory a write fails rather than evicting anything: platform state
            # (queues, leases, budgets) is never dropped. Tenant writes stop earlier
            # (ebb.queue.memory_headroom's high-water mark).
            "maxmemory": str(maxmemory_bytes(self.settings.redis_maxmemory_bytes)),
            "maxmemory-policy": "noeviction",
            "daemonize": "no",
            "logfile": str(self.log_path.resolve()),
        }
        return "".join(f"{name} {value}\n" for name, value in lines.items())

    def start(self) -> None:
        """Start redis-server and wait until it answers; RuntimeError if it does not."""
        self.settings.redis_dir.mkdir(parents=True, exist_ok=True)
        self.settings.logs_dir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            ["redis-server", "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert proc.stdin is not None
        proc.stdin.write(self.config().encode())
        proc.stdin.close()
        self.proc = proc
        self._started_s = time.monotonic()
        self._wait_answering()

    def _wait_answering(self) -> None:
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + _START_TIMEOUT_S
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:  # BusyLoadingError too: the AOF is loading
                    if self.proc is None or self.proc.poll() is not None:
                        raise RuntimeError(f"redis-server exited; see {self.log_path}") from None
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"redis-server did not answer; see {self.log_path}"
                        ) from None
                    time.sleep(0.05)
        finally:
            client.close()

    def watch(self) -> str | None:
        """Restart a dead server, at once the first time, then with doubling backoff;
        returns a line for the operator when something happened."""
        if self.proc is None or self.proc.poll() is None:
            return None
        now = time.monotonic()
        if self._next_start_s == 0.0:
            if now - self._started_s > _STABLE_AFTER_S:
                self.restarts = 0
            delay_s = backoff.delay_s(
                self.restarts + 1, first_s=_RESTART_BACKOFF_FIRST_S, cap_s=_RESTART_BACKOFF_MAX_S
            )
            self.restarts += 1
            self._next_start_s = now + delay_s
            return (
                f"redis-server exited ({self.proc.returncode}); restarting in {delay_s:.2f}s "
                f"(log: {self.log_path})"
            )
        if now < self._next_start_s:
            return None
        self._next_start_s = 0.0
        try:
            self.start()
        except RuntimeError as e:
            return f"redis-server restart failed: {e}"
        return f"redis-server restarted (append-only file reloaded), port {self.port}"

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (redis-server flushes its append-only file), SIGKILL past timeout_s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
