"""Builds the `World` one reconcile plans from, in one pass: the serving units and their
queues, the runner records (exits already collected), node caches, warm capacity, this
platform's GPUs and, where the launcher has nodes and some deployment may need a start,
the nodes. Reads only: every write is the executor's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from ebb.coldstart.gpu_need import estimate_need
from ebb.coldstart.gpu_reader import GpuReader
from ebb.coldstart.launcher import WarmStarts
from ebb.coldstart.placement import NodeCapacity
from ebb.coldstart.scaling import may_start_unqueued
from ebb.coldstart.scaling_tracker import ScalingTracker
from ebb.coldstart.state import ControllerState
from ebb.coldstart.world import Backoff, Demand, Gpus, World, serves
from ebb.config import Settings
from ebb.engines import EngineRegistry
from ebb.launching.stem_pools import StemPool, runner_gpus
from ebb.queue.schema import DeploymentSpec, RunnerRecord, RunnerState

log = logging.getLogger(__name__)


@runtime_checkable
class NodeLauncher(Protocol):
    """A launcher that knows its cluster's nodes (Kubernetes, Ray)."""

    def nodes(self) -> list[NodeCapacity]: ...


class WorldReader:
    def __init__(
        self,
        settings: Settings,
        state: ControllerState,
        warm: WarmStarts,
        *,
        pools: Mapping[str, StemPool],
        default_gpus: int,
        gpus: GpuReader | None = None,
        nodes: NodeLauncher | None = None,
        engines: EngineRegistry | None = None,
        scaling: ScalingTracker | None = None,
    ):
        """`default_gpus`: what a runner asks of its node when its engine does not say;
        `gpus`: this platform's GPUs (None: runners start on CPU); `nodes`: the cluster
        launcher's nodes, for the plan to prefer one."""
        self._settings = settings
        self._state = state
        self._warm = warm
        self._pools = pools
        self._default_gpus = default_gpus
        self._gpus = gpus
        self._nodes = nodes
        self._engines = engines
        self._scaling = scaling

    async def read(
        self,
        runners: Sequence[RunnerRecord],
        *,
        now_s: float,
        alive: Callable[[str], bool],
        backoffs: Mapping[str, Backoff],
        shown_unschedulable: Mapping[str, str] | None,
        wall_s: float = 0.0,
    ) -> World:
        """`runners`: every record as exit collection left it; `alive(runner)`: its
        process or heartbeat vouches for it."""
        gpus = await self._gpus.read(shown_unschedulable) if self._gpus is not None else None
        live = [r for r in runners if r.state.is_live]
        units = await self._state.serving_units()
        if self._scaling is not None:
            await self._scaling.read_latencies([spec.name for spec in units])
        demands = []
        for spec in units:
            own = [r for r in live if serves(r, spec)]
            demand = await self._measured(await self._demand(spec, own, backoffs), own, wall_s)
            demands.append(self._with_gpu_need(demand, gpus))
        caches = await self._state.node_caches()
        waiting = [r for r in live if r.state is RunnerState.PREWARMED and not r.deployment]
        return World(
            demands=tuple(demands),
            runners=tuple(runners),
            dead_stems=frozenset(r.runner_id for r in waiting if not alive(r.runner_id)),
            pools=self._pools,
            node_caches=caches,
            nodes=await self._read_nodes(demands, caches),
            warm=self._warm.warm_state(),
            gpus=gpus,
            now_s=now_s,
            wall_s=wall_s,
        )

    async def _demand(
        self,
        spec: DeploymentSpec,
        runners: list[RunnerRecord],
        backoffs: Mapping[str, Backoff],
    ) -> Demand:
        queue = await self._state.queue_snapshot(spec.name)
        return Demand(
            spec=spec,
            queue_depth=queue.depth,
            job_depth=queue.job_depth,
            oldest_wait_s=queue.oldest_wait_s,
            head_priority=queue.head_priority,
            ready=sum(r.state is RunnerState.READY for r in runners),
            starting=sum(r.is_starting for r in runners),
            sleepers=tuple(
                r.runner_id
                for r in runners
                if r.state is RunnerState.SLEEPING and not r.is_starting
            ),
            backoff=backoffs.get(spec.name),
            node_gpus=math.ceil(runner_gpus(spec, self._default_gpus)),
        )

    def _with_gpu_need(self, demand: Demand, gpus: Gpus | None) -> Demand:
        """The need is read from the weight cache's files: only for a deployment the plan
        may place (a start, or a recheck of one shown unschedulable)."""
        shown = gpus.shown_unschedulable if gpus is not None else None
        if gpus is None or not gpus.present:
            return demand
        if not (_may_start(demand) or demand.spec.name in (shown or {})):
            return demand
        engines = self._engines or EngineRegistry.from_settings(self._settings)
        self._engines = engines
        return dataclasses.replace(
            demand, gpu_need=estimate_need(self._settings, engines, demand.spec)
        )

    async def _measured(self, demand: Demand, runners: list[RunnerRecord], wall_s: float) -> Demand:
        """`demand` with what its scaling policies measure (only for a scaling block)."""
        if self._scaling is None or not self._scaling.tracks(demand.spec):
            return demand
        ready = [r.runner_id for r in runners if r.state is RunnerState.READY]
        queued = demand.queue_depth + demand.job_depth
        measured, cold_start_s = await self._scaling.measure(demand.spec, ready, wall_s, queued)
        return dataclasses.replace(demand, measured=measured, cold_start_s=cold_start_s)

    async def _read_nodes(
        self, demands: list[Demand], caches: Mapping[str, frozenset[str]]
    ) -> tuple[NodeCapacity, ...] | None:
        """The launcher's nodes with the caches their prefetchers published, read only
        when some deployment may start a runner (listing nodes is an API call)."""
        if self._nodes is None or not any(_may_start(d) for d in demands):
            return None
        try:
            nodes = await asyncio.to_thread(self._nodes.nodes)
        except Exception:  # placement is a preference: never a reason not to launch
            log.exception("coldstart: could not read the nodes; placing runners anywhere")
            return None
        return tuple(
            dataclasses.replace(n, cached_sources=n.cached_sources | caches.get(n.name, set()))
            for n in nodes
        )


def _may_start(demand: Demand) -> bool:
    """Whether the policy could ask for a start: something queued, fewer runners than
    the deployment's minimum, or a `scaling` block that starts runners with nothing
    queued (`scaling.may_start_unqueued`)."""
    queued = demand.queue_depth + demand.job_depth > 0
    scaled = may_start_unqueued(demand.spec.scaling, demand.measured)
    return queued or scaled or demand.ready + demand.starting < demand.spec.min_replicas
