"""`ebb up`: the whole platform on this machine, supervised.

Starts redis-server (password and append-only file under EBB_HOME, restarted with backoff
like every child, see `ebb.redis_server`) unless EBB_REDIS_URL is set, deploys the default
model (the controller prepares its weights, as for any deployment), then runs the
frontdoor, the coldstart controller, the webhooks worker (job results and deliveries) and
the billing consumer (unless EBB_METERING=0) as child processes, restarting any that dies.
Ctrl-C or SIGTERM stops everything in order: the frontdoor first (no new work), then the
controller (its runners drain), then the webhooks worker (it collects what the drained
runners finished), then billing, then Redis (which flushes its append-only file).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn

from ebb import backoff
from ebb.coldstart.environments import service_environment
from ebb.config import DEFAULT_MODEL_NAME, DEFAULT_MODEL_SOURCE, Settings
from ebb.home import resolve_admin_key, write_run_info
from ebb.launching.stem_pools import stems_wanted
from ebb.launching.tiers import WarmState
from ebb.process_memory import start_memory_reporter
from ebb.queue.connection import async_client
from ebb.queue.platform import PlatformState
from ebb.queue.schema import DeploymentSpec, RunnerState
from ebb.queue.weights_status import WeightsState, WeightsStatus
from ebb.redis_server import EmbeddedRedis

log = logging.getLogger(__name__)
# Soft wrap: a path or URL printed to a file or a narrow terminal stays one line.
console = Console(stderr=True, soft_wrap=True)

_RESTART_BACKOFF_FIRST_S = 2.0
_RESTART_BACKOFF_MAX_S = 30.0


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen | None = None
    restarts: int = 0
    next_start_s: float = 0.0
    log_path: str = ""


@dataclass
class Supervisor:
    settings: Settings
    children: list[Child] = field(default_factory=list)

    def start(self, child: Child) -> None:
        env = service_environment(self.settings)
        child.log_path = str(self.settings.logs_dir / f"{child.name}.log")
        with open(child.log_path, "ab") as log_file:
            # Own session: a terminal's Ctrl-C reaches only `ebb up`, which stops the
            # children in order instead of all at once.
            child.proc = subprocess.Popen(
                child.argv,
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def watch(self) -> None:
        """Restart any child that died, with backoff."""
        for child in self.children:
            if child.proc is None or child.proc.poll() is None:
                continue
            now = time.monotonic()
            if child.next_start_s == 0.0:
                child.restarts += 1
                delay = backoff.delay_s(
                    child.restarts, first_s=_RESTART_BACKOFF_FIRST_S, cap_s=_RESTART_BACKOFF_MAX_S
                )
                child.next_start_s = now + delay
                console.print(
                    f"[yellow]{child.name} exited ({child.proc.returncode}); "
                    f"restarting in {delay:.0f}s (log: {child.log_path})"
                )
            elif now >= child.next_start_s:
                child.next_start_s = 0.0
                self.start(child)

    def stop(self, grace_s: float = 40.0) -> None:
        for child in self.children:  # in start order: frontdoor first
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
                try:
                    child.proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    child.proc.kill()
                    child.proc.wait()


async def _deploy_default(settings: Settings) -> None:
    """The default model, deployed once per EBB_HOME; the controller prepares its weights
    (the first run converts the GGUF) as for any deployment."""
    state = PlatformState(async_client(settings.redis_url))
    spec = DeploymentSpec(
        name=DEFAULT_MODEL_NAME, source=DEFAULT_MODEL_SOURCE, created_at_s=time.time()
    )
    try:
        if await state.put_deployment(spec, create_only=True):
            await state.set_deployment_status(
                spec.name, **WeightsStatus(WeightsState.PREPARING).fields()
            )
            console.print(f"deployed [bold]{DEFAULT_MODEL_NAME}[/] from {DEFAULT_MODEL_SOURCE}")
    finally:
        await state.redis.aclose()


@dataclass(frozen=True)
class _Readiness:
    """What `ebb up` waits for before it says `ready:`."""

    answering: bool  # the frontdoor's /readyz
    pool_filled: bool  # EBB_PREWARM stems waiting for an assignment
    # The fork server has imported the engine (or there is none): a first request then
    # never competes with that import for the cores (it slowed a pre-warmed start 4x).
    warm_done: bool
    weights: WeightsStatus | None  # the default model's, when it is deployed

    @property
    def ready(self) -> bool:
        weights_ready = self.weights is None or self.weights.state is WeightsState.READY
        return self.answering and self.pool_filled and self.warm_done and weights_ready

    def describe(self) -> str:
        if self.weights is not None and self.weights.state is WeightsState.PREPARING:
            phase = self.weights.phase or "starting"
            return f"preparing the default model ({phase}; the first run converts its GGUF)"
        if self.pool_filled and not self.warm_done:
            return "starting the fork server (importing the engine once for every runner)"
        return "starting the frontdoor, controller and pre-warmed runner pool"


def _answering(settings: Settings) -> bool:
    try:
        return httpx.get(settings.base_url + "/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


async def _readiness(settings: Settings, default_model: bool, answering: bool) -> _Readiness:
    state = PlatformState(async_client(settings.redis_url))
    try:
        runners = await state.runners()
        fork_server = await state.fork_server_state()
        weights = None
        if default_model:
            weights = WeightsStatus.of(await state.deployment_status(DEFAULT_MODEL_NAME))
    finally:
        await state.redis.aclose()
    stems = sum(r.state is RunnerState.PREWARMED and not r.deployment for r in runners)
    warm_done = not settings.fork_server or fork_server == WarmState.READY
    wanted = stems_wanted(settings.stem_pools, prewarm=settings.prewarm)
    return _Readiness(answering, stems >= wanted, warm_done, weights)


def _wait_ready(
    settings: Settings, stop: threading.Event, *, default_model: bool, timeout_s: float = 600.0
) -> bool:
    deadline = time.monotonic() + timeout_s
    # One line: what is being waited for, and the default model's preparation as a bar
    # (a pulsing one while there is no fraction to show); gone once ready.
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        console=console,
        transient=True,
    ) as progress:
        shown = progress.add_task("starting the frontdoor, controller and pool", total=None)
        while not stop.is_set() and time.monotonic() < deadline:
            answering = _answering(settings)
            readiness = asyncio.run(_readiness(settings, default_model, answering))
            if readiness.ready:
                return True
            if readiness.weights is not None and readiness.weights.state is WeightsState.FAILED:
                console.print(f"[red]the default model's weights failed: {readiness.weights.error}")
                return False
            preparing = readiness.weights is not None and readiness.weights.state is (
                WeightsState.PREPARING
            )
            fraction = readiness.weights.progress if readiness.weights and preparing else None
            progress.update(
                shown,
                description=readiness.describe(),
                total=1.0 if fraction is not None else None,
                completed=fraction or 0.0,
            )
            stop.wait(0.2)
    return False


def run_up(settings: Settings, *, default_model: bool = True) -> int:
    settings.logs_dir.mkdir(parents=True, exist_ok=True)
    admin_key = resolve_admin_key(settings)
    settings = settings.model_copy(update={"admin_key": admin_key})
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    embedded = None
    if not settings.redis_url:
        embedded = EmbeddedRedis(settings)
        embedded.start()
        settings = settings.model_copy(update={"redis_url": embedded.url})
    supervisor = Supervisor(settings)
    try:
        if default_model:
            asyncio.run(_deploy_default(settings))
        supervisor.children = [
            Child("frontdoor", [sys.executable, "-m", "ebb", "frontdoor"]),
            Child("coldstart", [sys.executable, "-m", "ebb", "coldstart"]),
            Child("webhooks", [sys.executable, "-m", "ebb", "webhooks"]),
        ]
        if settings.metering:
            supervisor.children.append(Child("billing", [sys.executable, "-m", "ebb", "billing"]))
        for child in supervisor.children:
            supervisor.start(child)
        start_memory_reporter(
            settings.redis_url or "",
            "up",
            others=lambda: (
                [("redis", embedded.proc.pid)]
                if embedded is not None and embedded.proc is not None
                else []
            ),
        )
        started = ", ".join(c.name for c in supervisor.children)
        port = urlsplit(settings.redis_url or "").port
        redis_note = f"redis-server (port {port}), " if embedded is not None else ""
        console.print(f"started: {redis_note}{started}")
        if not _wait_ready(settings, stop, default_model=default_model):
            console.print(f"[red]the platform did not become ready; logs in {settings.logs_dir}")
            return 1
        write_run_info(settings, base_url=settings.base_url, redis_url=settings.redis_url)
        # The admin key goes to the terminal only: never to a log file.
        print(
            f"ready: {settings.base_url}/v1  admin key: {admin_key}  logs: {settings.logs_dir}",
            flush=True,
        )
        while not stop.wait(0.5):
            if embedded is not None and (line := embedded.watch()):
                console.print(f"[yellow]{line}")
            supervisor.watch()
        console.print("stopping: frontdoor, controller (runners drain), webhooks, billing, redis")
        return 0
    finally:
        # The frontdoor drains its streams for up to EBB_FRONTDOOR_DRAIN_S before it exits.
        supervisor.stop(grace_s=max(40.0, settings.frontdoor_drain_s + 10.0))
        if embedded is not None:
            embedded.stop()
