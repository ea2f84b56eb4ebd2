"""Runners as Ray actors (`ebb[ray]`): Ray decides the node from each runner's resources.

Each runner is an actor (`RunnerActor`) holding one `python -m ebb runner` process on the
node Ray placed it on; the actor asks for the runner's GPUs (`num_gpus`) and custom
resources (say `{"gpu_pool_a": 1}`), so Ray's scheduler, not ebb, picks the node. Stems
of a node pool (`launch_stem`) are actors too, on nodes offering the pool's resource. The
runner process follows its actor (EBB_RUNNER_FOLLOWS_PARENT): an actor that dies takes its
runner with it. `poll` reports each runner's end exactly once: its exit code, or -1 with
Ray's reason when the actor or its node died (the runner's leases then expire in Redis and
its requests end with runner_lost, as for any lost runner).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ebb.coldstart.fork_client import Exit
from ebb.coldstart.placement import NodeCapacity, Placement
from ebb.launching.stem_pools import StemPool
from ebb.launching.tiers import Tier

log = logging.getLogger(__name__)

NAMESPACE = "ebb"
# What one stem takes of its pool's custom resource: a node offering {"pool": 1} holds 100.
POOL_RESOURCE_PER_STEM = 0.01


class RunnerActor:
    """One runner process on the actor's node (run as a Ray actor, threaded, so that
    `terminate` is served while `wait` blocks)."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: str):
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        # The runner names its node as placement does: by Ray's node id. Ray set this
        # actor's devices (CUDA_VISIBLE_DEVICES, from num_gpus): the runner inherits them.
        env = dict(env, EBB_NODE_NAME=ray.get_runtime_context().get_node_id())
        if "CUDA_VISIBLE_DEVICES" in os.environ:
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        with open(log_path, "ab") as log_file:
            self._proc = subprocess.Popen(
                argv, env=env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def where(self) -> tuple[str, int]:
        """(Ray node id, runner pid)."""
        return ray.get_runtime_context().get_node_id(), self._proc.pid

    def wait(self) -> int:
        return self._proc.wait()

    def terminate(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)


@dataclass
class _Run:
    actor: Any
    done: Any  # ObjectRef of RunnerActor.wait


class RayLauncher:
    def __init__(
        self,
        env: dict[str, str],
        logs_dir: Path,
        *,
        resources_for: Callable[[str | None], dict[str, float]] = lambda deployment: {},
        gpus_for: Callable[[str | None], float] = lambda deployment: 0,
    ):
        """`env`: the runner processes' environment (`child_environment`); Ray must be
        initialised (`ray.init(address=...)`) by the caller."""
        self._env = dict(env, EBB_RUNNER_FOLLOWS_PARENT="1")
        self._logs_dir = logs_dir
        self._resources_for = resources_for
        self._gpus_for = gpus_for
        self._runs: dict[str, _Run] = {}
        self._actor_class = ray.remote(max_concurrency=4, num_cpus=0)(RunnerActor)

    def launch(self, runner_id: str, deployment: str | None, tier: Tier) -> None:
        self.launch_on(runner_id, deployment, tier, Placement())

    def launch_on(
        self, runner_id: str, deployment: str | None, tier: Tier, placement: Placement
    ) -> None:
        options: dict[str, Any] = {
            "num_gpus": self._gpus_for(deployment),
            "resources": self._resources_for(deployment),
        }
        if placement.node:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                placement.node, soft=True
            )
        self._start(runner_id, deployment, tier, options)

    def launch_stem(self, runner_id: str, pool: StemPool) -> None:
        """A stem actor on a node offering the custom resource named after its pool (a
        sliver of it: a node holds as many stems as it has room for), with the pool's GPUs."""
        options = {"num_gpus": pool.gpus, "resources": {pool.name: POOL_RESOURCE_PER_STEM}}
        self._start(runner_id, None, Tier.PREWARMED, options)

    def _start(
        self, runner_id: str, deployment: str | None, tier: Tier, options: dict[str, Any]
    ) -> None:
        argv = [sys.executable, "-m", "ebb", "runner", "--runner-id", runner_id, "--tier", tier]
        if deployment is not None:
            argv += ["--deployment", deployment]
        options.update(name=runner_id, namespace=NAMESPACE)
        log_path = str(self._logs_dir / f"runner-{runner_id}.log")
        actor = self._actor_class.options(**options).remote(argv, self._env, log_path)
        self._runs[runner_id] = _Run(actor, actor.wait.remote())
        log.info("coldstart: ray actor for runner %s (%r, %s)", runner_id, deployment or "", tier)

    def poll(self) -> list[Exit]:
        if not self._runs:
            return []
        refs = {run.done: runner_id for runner_id, run in self._runs.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        exits = []
        for ref in ready:
            runner_id = refs[ref]
            run = self._runs.pop(runner_id)
            try:
                exits.append(Exit(runner_id, int(ray.get(ref))))
            except ray.exceptions.RayError as e:  # the actor, its worker or its node died
                exits.append(Exit(runner_id, -1, f"ray: {type(e).__name__}: {e}"[:2000]))
            ray.kill(run.actor, no_restart=True)
        return exits

    def alive(self, runner_id: str) -> bool:
        return runner_id in self._runs

    def where(self, runner_id: str, timeout_s: float = 30.0) -> tuple[str, int]:
        """(Ray node id, pid) of a running runner: where Ray placed it."""
        result: tuple[str, int] = ray.get(
            self._runs[runner_id].actor.where.remote(), timeout=timeout_s
        )
        return result

    def stop_all(self, grace_s: float) -> None:
        for run in self._runs.values():
            run.actor.terminate.remote()
        refs = [run.done for run in self._runs.values()]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=grace_s)
        for run in self._runs.values():
            ray.kill(run.actor, no_restart=True)
        self._runs.clear()

    def nodes(self) -> list[NodeCapacity]:
        """Ray's live nodes and their GPUs (Ray itself accounts for what actors hold)."""
        return [
            NodeCapacity(name=n["NodeID"], free_gpus=int(n["Resources"].get("GPU", 0)))
            for n in ray.nodes()
            if n.get("Alive")
        ]
