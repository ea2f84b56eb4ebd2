"""Test support: real redis-server and real platform processes on free loopback ports.

The narrower helpers are this package's modules (`support.billing`, `support.weights`,
`support.webhook_receiver`, `support.chaos`, ...); `tests/` is on the path (pytest's
`pythonpath`, and each bench script's own), so tests import them as `support.<module>`."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

REPO_ROOT = Path(__file__).resolve().parents[2]
# Converted weights survive between local runs (the directory is git-ignored), so only the
# first run on a machine pays for the GGUF -> safetensors conversion.
TEST_WEIGHTS_DIR = REPO_ROOT / ".ebb" / "test-weights"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition: Callable[[], object], timeout_s: float, what: str, poll_s=0.05):
    """Poll `condition` until it returns something truthy; fail with `what` on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)


@dataclass
class RedisServer:
    port: int
    data_dir: Path
    proc: subprocess.Popen | None = None
    # As `ebb up` runs its own (ebb.redis_server): bounded, and never evicting state.
    maxmemory_bytes: int = 2 * 1024**3

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.data_dir),
                "--appendonly",
                "yes",
                "--save",
                "",
                "--maxmemory",
                str(self.maxmemory_bytes),
                "--maxmemory-policy",
                "noeviction",
            ],
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        client = redis.Redis.from_url(self.url)

        def up():
            try:
                return client.ping()
            except redis.ConnectionError:
                return False

        wait_until(up, 20, "redis-server to answer")
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


@dataclass
class Platform:
    """`ebb up` as a subprocess, with its own EBB_HOME and ports."""

    home: Path
    redis_url: str | None
    env_extra: dict[str, str] = field(default_factory=dict)
    default_model: bool = False
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    admin_key: str = "ebb-admin-test-" + os.urandom(8).hex()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            EBB_HOME=str(self.home),
            EBB_PORT=str(self.port),
            EBB_ADMIN_KEY=self.admin_key,
            EBB_PREWARM="0",
            # Each would import vLLM (~8 s of CPU); the tests that need one turn it on.
            EBB_FORK_SERVER="0",
            PYTHONUNBUFFERED="1",
        )
        if self.redis_url:
            env["EBB_REDIS_URL"] = self.redis_url
        env.update(self.env_extra)
        return env

    def start(self, timeout_s: float = 300) -> Platform:
        cmd = [sys.executable, "-m", "ebb", "up"]
        if not self.default_model:
            cmd.append("--no-default-model")
        self.home.mkdir(parents=True, exist_ok=True)
        self._log = open(self.home / "up.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd, env=self.env(), stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO_ROOT
        )
        wait_until(
            self._ready, timeout_s, f"ebb up to print ready (log: {self.log_path})", poll_s=0.2
        )
        return self

    @property
    def log_path(self) -> Path:
        return self.home / "up.log"

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"ebb up exited early:\n{self.log_path.read_text()[-4000:]}")
        return re.search(rb"^ready: http", self.log_path.read_bytes(), re.MULTILINE) is not None

    def wait_for_fork_server(self, timeout_s: float = 300) -> None:
        """Until the controller's fork server has imported the engine (EBB_FORK_SERVER=1)."""
        try:
            with self.admin() as admin:
                wait_until(
                    lambda: admin.get("/v1/status").json()["fork_server"] == "ready",
                    timeout_s,
                    "the fork server to import the engine",
                    poll_s=0.2,
                )
        except AssertionError:
            self.stop()  # a fixture that fails here never reaches its teardown
            raise

    def stop(self, timeout_s: float = 60) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout_s)
        self._log.close()
        return code

    def admin(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            timeout=120,
            headers={"Authorization": f"Bearer {self.admin_key}"},
        )

    def redis(self) -> redis.Redis:
        """A client of the platform's own Redis (run.json names it once `ebb up` is ready)."""
        run_info = json.loads((self.home / "run.json").read_text())
        return redis.Redis.from_url(run_info["redis_url"])

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        """Runs `ebb ARGS` against this platform as a script would.

        Only the platform's address, key and home come from the test; `env` overrides them
        (a value of "" removes the variable).
        """
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("EBB_")}
        full_env.update(
            EBB_PORT=str(self.port),
            EBB_ADMIN_KEY=self.admin_key,
            EBB_HOME=str(self.home),
            COLUMNS="200",  # rich wraps tables to the terminal; keep every cell on one line
        )
        full_env.update(env)
        return subprocess.run(
            [sys.executable, "-m", "ebb", *args],
            env={k: v for k, v in full_env.items() if v != ""},
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )

    def openai(self, api_key: str | None = None, **kwargs):
        import openai

        return openai.OpenAI(
            base_url=self.base_url + "/v1",
            api_key=api_key or self.admin_key,
            max_retries=0,
            **kwargs,
        )


# Every home `temp_home` made in this process: a pytest session that passes removes them
# (tests/conftest.py); a failing one keeps them, for the logs that say what went wrong.
TEMP_HOMES: list[Path] = []


def temp_home(prefix: str) -> Path:
    home = Path(tempfile.mkdtemp(prefix=prefix))
    TEMP_HOMES.append(home)
    return home


def fake_gpu_inventory(home: Path, count: int, gib: int = 24) -> Path:
    """A GPU inventory file (EBB_GPU_INVENTORY_FILE) of `count` idle `gib` GiB devices, for
    a platform that places runners on GPUs it does not have."""
    home.mkdir(parents=True, exist_ok=True)
    inventory = home / "gpus.json"
    devices = [
        {
            "index": i,
            "uuid": f"GPU-fake-{i}",
            "name": f"Fake {gib}G",
            "total_bytes": gib * 1024**3,
            "free_bytes": gib * 1024**3,
            "utilization_pct": 0,
            "temperature_c": 30,
        }
        for i in range(count)
    ]
    inventory.write_text(json.dumps(devices))
    return inventory


@contextmanager
def real_engine_platform(
    home_prefix: str, *, default_model: bool = False, **env: str
) -> Iterator[Platform]:
    """`ebb up` on the real engine, sharing the weights the session converted once; it must
    stop cleanly."""
    platform = Platform(
        home=temp_home(home_prefix),
        redis_url=None,
        default_model=default_model,
        env_extra={"EBB_WEIGHTS_CACHE_DIR": str(TEST_WEIGHTS_DIR), **env},
    ).start(timeout_s=600)
    try:
        yield platform
    except BaseException:
        platform.stop()
        raise
    assert platform.stop() == 0


def deploy(admin: httpx.Client, name: str, source: str = "fake://m", **fields) -> dict:
    response = admin.post("/v1/deployments", json={"name": name, "source": source, **fields})
    assert response.status_code == 201, response.text
    return response.json()


def deployment(admin: httpx.Client, name: str) -> dict:
    return admin.get(f"/v1/deployments/{name}").json()


def sigkill_runner_mid_stream(admin: httpx.Client, name: str, n: int = 1) -> tuple[dict, list[str]]:
    """Stream a long answer from deployment `name`, SIGKILL its runner after the first
    event; the runner (as the API showed it) and every `data:` line of the stream, which
    must end on its own (a hang fails by timeout). With `n` > 1 choices no continuation
    can replay the output: the stream ends with the runner_lost error."""
    body = {
        "model": name,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 1500,
        "stream": True,
        "n": n,
    }
    with admin.stream("POST", "/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = (line for line in response.iter_lines() if line.startswith("data: "))
        events = [next(lines)]
        [runner] = [r for r in deployment(admin, name)["runners"] if r["state"] == "ready"]
        os.kill(runner["pid"], signal.SIGKILL)
        events += list(lines)
    return runner, events


def wait_for_weights(admin: httpx.Client, name: str, timeout_s: float = 300) -> dict:
    """Until the deployment's weights are in the cache (its deploy-time prefetch)."""
    return wait_until(
        lambda: (d := deployment(admin, name))["weights"] == "ready" and d,
        timeout_s,
        f"the weights of {name}",
    )
