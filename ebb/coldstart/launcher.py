"""Launchers start and stop runner processes; the controller decides when.

Two seams: `Launcher` (start a runner, learn of its exit, stop them all) for other
placements (Kubernetes pods, Ray actors), and `WarmStarts` (is there warm capacity a new
runner can start from: today the local fork server, per node later). The local launcher
implements both: runners as child processes of the controller, each logging to its own
file, forked from the fork server once it is ready.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol, runtime_checkable

from ebb.coldstart.environments import child_environment
from ebb.coldstart.fork_client import Exit, ForkServerClient
from ebb.config import Settings
from ebb.launching.handoff import LAUNCHED_AT_ENV
from ebb.launching.stem_pools import StemPool
from ebb.launching.tiers import Tier, WarmState

log = logging.getLogger(__name__)


class Launcher(Protocol):
    """Starts runner processes wherever they run; knows nothing of deployments' demand."""

    def launch(self, runner_id: str, deployment: str | None, tier: Tier) -> None:
        """Start a runner (a stem for the pool when `deployment` is None) and return once
        it was started, not once it is ready; the runner reports its own progress in its
        record. A start that fails here is reported by `poll` like any exit."""
        ...

    def poll(self) -> list[Exit]:
        """Runners that exited since the last call: each launched runner exactly once."""
        ...

    def alive(self, runner_id: str) -> bool:
        """The runner's process is running (False once it exited, or if never launched)."""
        ...

    def stop_all(self, grace_s: float) -> None:
        """Ask every runner to drain, wait up to `grace_s`, then kill the rest."""
        ...


@runtime_checkable
class PoolLauncher(Protocol):
    """A `Launcher` of a cluster with node pools (Kubernetes, Ray)."""

    def launch_stem(self, runner_id: str, pool: StemPool) -> None:
        """Start a stem (no deployment, tier PREWARMED) on a node of `pool` only, holding
        the pool's GPUs; reported by `poll` like any runner."""
        ...


class WarmStarts(Protocol):
    def warm_state(self) -> WarmState:
        """Contract: READY means the next `launch` starts from a process that already
        imported the engine (the forked tier); anything else, a fresh one."""
        ...


class NoWarmStarts:
    """Warm capacity for a launcher that has none."""

    def warm_state(self) -> WarmState:
        return WarmState.OFF


class LocalProcessLauncher:
    """Runners as local processes: forked from the fork server once it is ready (the
    engine already imported), spawned as new interpreters before that or without one.
    A `Launcher` and the `WarmStarts` of its fork server."""

    def __init__(self, settings: Settings):
        self._settings = settings
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        settings.logs_dir.mkdir(parents=True, exist_ok=True)
        self._forks = (
            ForkServerClient(child_environment(settings), settings.logs_dir / "fork-server.log")
            if settings.fork_server
            else None
        )

    def log_path(self, runner_id: str) -> Path:
        return self._settings.logs_dir / f"runner-{runner_id}.log"

    def warm_state(self) -> WarmState:
        if self._forks is None or self._forks.disabled_reason:
            return WarmState.OFF
        if self._forks.ready():
            return WarmState.READY
        return WarmState.STARTING if self._forks.starting() else WarmState.DOWN

    def launch(self, runner_id: str, deployment: str | None, tier: Tier) -> None:
        if self._forks is not None and self._forks.ready():
            self._forks.spawn(runner_id, deployment, tier, self.log_path(runner_id))
            how = "forked"
        else:
            self._spawn(runner_id, deployment, tier)
            how = "spawned"
        log.info("coldstart: %s runner %s (%s) for %r", how, runner_id, tier, deployment or "")

    def _spawn(self, runner_id: str, deployment: str | None, tier: Tier) -> None:
        cmd = [sys.executable, "-m", "ebb", "runner", "--runner-id", runner_id, "--tier", tier]
        if deployment is not None:
            cmd += ["--deployment", deployment]
        env = child_environment(self._settings)
        env[LAUNCHED_AT_ENV] = str(time.time() * 1000)
        with open(self.log_path(runner_id), "ab") as log_file:
            self._procs[runner_id] = subprocess.Popen(
                cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def poll(self) -> list[Exit]:
        exits = []
        for runner_id, proc in list(self._procs.items()):
            code = proc.poll()
            if code is not None:
                del self._procs[runner_id]
                exits.append(Exit(runner_id, code))
        if self._forks is not None:
            exits += self._forks.poll()
        return exits

    def alive(self, runner_id: str) -> bool:
        proc = self._procs.get(runner_id)
        if proc is not None:
            return proc.poll() is None
        return self._forks is not None and self._forks.alive(runner_id)

    def local_processes(self) -> list[tuple[str, int]]:
        """(role, pid) of the helper processes it runs on this host: the fork server."""
        pid = self._forks.server_pid() if self._forks is not None else None
        return [("fork-server", pid)] if pid is not None else []

    def kill(self, runner_id: str) -> None:
        proc = self._procs.get(runner_id)
        if proc is not None and proc.poll() is None:
            proc.kill()
        elif self._forks is not None:
            self._forks.signal(runner_id, signal.SIGKILL)

    def stop_all(self, grace_s: float) -> None:
        forks = self._forks
        forked = forks.runner_ids() if forks is not None else []
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        if forks is not None:
            for runner_id in forked:
                forks.signal(runner_id, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for runner_id, proc in self._procs.items():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning(
                    "coldstart: runner %s did not drain in %.0fs, killing", runner_id, grace_s
                )
                proc.kill()
                proc.wait()
        self._procs.clear()
        if forks is not None:
            _stop_forked(forks, forked, deadline)


def _stop_forked(forks: ForkServerClient, forked: list[str], deadline: float) -> None:
    while any(forks.alive(r) for r in forked) and time.monotonic() < deadline:
        forks.poll()
        time.sleep(0.1)
    for runner_id in forked:
        if forks.alive(runner_id):
            log.warning("coldstart: runner %s did not drain in time, killing", runner_id)
            forks.signal(runner_id, signal.SIGKILL)
    forks.close()
