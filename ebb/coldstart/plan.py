"""The controller's decisions: `plan(world)` is a pure function from one `World` snapshot
to the actions that reconcile should take, as data. `executor.Executor` applies them.

Per deployment, in order: clear its backoff once a runner made it; ask the policy how
many runners it should have; then fill each missing one from the fastest tier there is —
a sleeping runner of the deployment whose devices still have room (`WakeSleeper`), then,
with GPUs placed here (`placement.place`: on a host holding its weights first; nothing
fits: `MarkUnschedulable` with the numbers, and no start), a waiting stem
(`placement.rank_stems`: on a node holding the weights, from the pool sparing the fewest
GPUs; `AssignStem`), else a new process (`Launch`: forked once the fork server is ready,
fresh before, onto the node `placement.choose_placement` prefers where the nodes are
known: `launchers.node_source`, Kubernetes). Within one plan every decision sees the
earlier ones: a device reserved for one runner is not offered to the next, a stem is
assigned once.

Around that: the first plan of a controller clears whatever `unschedulable` an earlier
one left; a deployment shown unschedulable is cleared once it fits; sleepers beyond the
host's RAM budget are drained (`Drain`, oldest first); a stem whose process died is
dropped before it is handed work (`DropStem`); the pools are refilled (`Launch` of a stem)
once no runner is loading for real work and the fork server is not importing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from ebb.coldstart.placement import (
    NodeCapacity,
    Placed,
    Placement,
    Refused,
    choose_placement,
    place,
    rank_stems,
)
from ebb.coldstart.plan_gpus import GpuLedger
from ebb.coldstart.policy import DemandSnapshot, PolicyConfig, desired_replicas
from ebb.coldstart.priority import by_urgency
from ebb.coldstart.world import Demand, World
from ebb.launching.stem_pools import StemPool
from ebb.launching.tiers import Tier, WarmState, launch_tier
from ebb.queue.gpu_records import GpuPlacement
from ebb.queue.schema import RunnerState

# --- actions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClearBackoff:
    """A runner of the deployment made it: it is healthy again (its error cleared)."""

    deployment: str


@dataclass(frozen=True)
class MarkUnschedulable:
    """Show why the deployment's runners fit no device ("" clears it)."""

    deployment: str
    reason: str


@dataclass(frozen=True)
class Drain:
    """Make a sleeping runner exit (its host's RAM budget for sleepers is spent)."""

    runner_id: str
    deployment: str
    reason: str


@dataclass(frozen=True)
class DropStem:
    """A waiting stem whose process is gone: out of the pool, never handed work."""

    runner_id: str
    reason: str = "stem died while pre-warmed"


@dataclass(frozen=True)
class WakeSleeper:
    """Wake one of `candidates` (sleepers of the deployment whose devices have room, best
    first); which one is the claim's (another controller may have taken one)."""

    deployment: str
    uid: str
    candidates: tuple[str, ...]


@dataclass(frozen=True)
class AssignStem:
    """Give a waiting stem the deployment, on `gpu` devices (None: CPU, or its node's)."""

    stem: str
    deployment: str
    uid: str
    gpu: GpuPlacement | None = None


@dataclass(frozen=True)
class Launch:
    """Start a new runner: of `deployment` (None: a stem of `pool`), of `tier`, on
    `placement` (a node and its devices: "" and () let the launcher's scheduler decide)
    and `gpu` (the devices reserved on a host whose GPUs the controller places)."""

    tier: Tier
    deployment: str | None = None
    uid: str = ""
    placement: Placement = Placement()
    gpu: GpuPlacement | None = None
    pool: StemPool | None = None  # a stem's
    gpus: float = 0  # what the runner asks of its node (a stem: its pool's)


Action = ClearBackoff | MarkUnschedulable | Drain | DropStem | WakeSleeper | AssignStem | Launch
STARTS = (WakeSleeper, AssignStem, Launch)


def deployment_of(action: Action) -> str | None:
    """The deployment an action is about (None: the platform's own, a stem or a drop)."""
    if isinstance(action, DropStem):
        return None
    return action.deployment


# --- the plan ------------------------------------------------------------------------------


def plan(world: World, policy: PolicyConfig = PolicyConfig()) -> list[Action]:
    """What this reconcile does, in order (see the module docstring)."""
    planner = _Planner(world)
    actions: list[Action] = []
    actions += planner.recheck_unschedulable()
    actions += planner.drain_over_budget()
    # Scarce stems and devices go to the most urgent waiting work first.
    for demand in by_urgency(world.demands):
        actions += planner.scale(demand, policy)
    actions += _refill(world)
    return actions


def demand_snapshot(demand: Demand) -> DemandSnapshot:
    return DemandSnapshot(
        queue_depth=demand.queue_depth + demand.job_depth,
        oldest_wait_s=demand.oldest_wait_s,
        starting=demand.starting,
        ready=demand.ready,
        min_replicas=demand.spec.min_replicas,
        max_replicas=demand.spec.max_replicas,
        target_concurrency=demand.spec.max_concurrency,
    )


class _Planner:
    """One plan's running account: what earlier decisions of the same plan took."""

    def __init__(self, world: World):
        self._world = world
        self._stems = world.waiting_stems
        self._dropped: set[str] = set()
        self._gpus = GpuLedger(world.gpus, world.runners) if world.gpus else None
        self._shown = dict(world.gpus.shown_unschedulable or {}) if world.gpus else {}
        self._nodes = list(world.nodes) if world.nodes is not None else None

    def recheck_unschedulable(self) -> list[Action]:
        gpus = self._world.gpus
        if gpus is None:
            return []
        if gpus.shown_unschedulable is None:
            return [MarkUnschedulable(d.name, "") for d in self._world.demands]
        actions: list[Action] = []
        for demand in self._world.demands:
            if demand.name in self._shown and demand.gpu_need is not None and gpus.present:
                actions += self._mark(demand.name, self._place(demand, reserve=False)[1])
        return actions

    def drain_over_budget(self) -> list[Action]:
        if self._gpus is None:
            return []
        return [
            Drain(runner_id, deployment, why)
            for runner_id, deployment, why in self._gpus.over_sleep_budget()
        ]

    def scale(self, demand: Demand, policy: PolicyConfig) -> list[Action]:
        actions: list[Action] = []
        backoff = demand.backoff
        if backoff is not None and demand.ready:
            actions.append(ClearBackoff(demand.name))
            backoff = None
        snap = demand_snapshot(demand)
        missing = desired_replicas(snap, policy) - snap.serving
        if missing <= 0 or (backoff is not None and self._world.now_s < backoff.next_try_s):
            return actions
        sleepers = list(demand.sleepers)
        for _ in range(missing):
            start = self._start_one(demand, sleepers)
            if not start:
                break
            actions += start
        return actions

    def _start_one(self, demand: Demand, sleepers: list[str]) -> list[Action]:
        """The actions that start one runner of `demand` ([] when none can start now)."""
        wakeable = [s for s in sleepers if self._gpus is None or self._gpus.can_wake(s)]
        if wakeable:
            sleepers.remove(wakeable[0])
            if self._gpus is not None:
                self._gpus.wake(wakeable[0])
            return [WakeSleeper(demand.name, demand.spec.uid, tuple(wakeable))]
        actions: list[Action] = []
        gpu: GpuPlacement | None = None
        if self._gpus is not None and self._gpus.present:
            if demand.gpu_need is None:
                return []  # its weights are not prepared yet: asked again next reconcile
            gpu, reason = self._place(demand, reserve=True)
            actions += self._mark(demand.name, reason)
            if reason:
                return actions
        actions += self._dead_stems_first(demand)
        stem = self._take_stem(demand)
        if stem is not None:
            return [*actions, AssignStem(stem, demand.name, demand.spec.uid, gpu)]
        tier = launch_tier(self._world.warm is WarmState.READY)
        placement = self._choose_node(demand)
        launch = Launch(tier, demand.name, demand.spec.uid, placement, gpu, gpus=demand.node_gpus)
        return [*actions, launch]

    def _place(self, demand: Demand, *, reserve: bool) -> tuple[GpuPlacement | None, str]:
        """(devices for one runner, "") or (None, why nothing fits)."""
        assert self._gpus is not None and demand.gpu_need is not None
        result = place(
            demand.gpu_need,
            self._gpus.inventories,
            self._gpus.held(),
            tensor_parallel_size=demand.spec.engine.tensor_parallel_size,
            deployment=demand.name,
            holding=_holding(self._world, demand.spec.source),
            priority=demand.spec.priority,
        )
        if isinstance(result, Refused):
            return None, result.reason
        if isinstance(result, Placed):
            if reserve:
                self._gpus.reserve(result.placement)
            return result.placement, ""
        return None, ""

    def _mark(self, deployment: str, reason: str) -> list[Action]:
        if self._shown.get(deployment, "") == reason:
            return []
        if reason:
            self._shown[deployment] = reason
        else:
            self._shown.pop(deployment, None)
        return [MarkUnschedulable(deployment, reason)]

    def _dead_stems_first(self, demand: Demand) -> list[Action]:
        """Drop the dead stems that would be handed this runner before a live one."""
        actions: list[Action] = []
        while (best := self._best_stem(demand)) is not None and best in self._world.dead_stems:
            self._dropped.add(best)
            actions.append(DropStem(best))
        return actions

    def _best_stem(self, demand: Demand) -> str | None:
        waiting = [s for s in self._stems if s.runner_id not in self._dropped]
        if not waiting:
            return None
        ranked = rank_stems(
            waiting,
            self._world.pools,
            demand.spec.source,
            demand.node_gpus,
            self._world.node_caches,
        )
        return ranked[0] if ranked else None

    def _take_stem(self, demand: Demand) -> str | None:
        stem = self._best_stem(demand)
        if stem is not None:
            self._stems = [s for s in self._stems if s.runner_id != stem]
        return stem

    def _choose_node(self, demand: Demand) -> Placement:
        """The node preferred for a new runner (its weights cached there, then warm
        capacity, then free GPUs): a preference the launcher's scheduler may overrule."""
        if self._nodes is None:
            return Placement()
        chosen = choose_placement(self._nodes, demand.spec.source, demand.node_gpus)
        if chosen is None:
            return Placement()
        self._nodes = [_taking(n, chosen, demand.node_gpus) for n in self._nodes]
        return chosen


def _taking(node: NodeCapacity, chosen: Placement, gpus: int) -> NodeCapacity:
    if node.name != chosen.node:
        return node
    return dataclasses.replace(node, free_gpus=max(0, node.free_gpus - gpus))


def _holding(world: World, source: str) -> set[str]:
    return {node for node, sources in world.node_caches.items() if source in sources}


def _refill(world: World) -> list[Action]:
    """Stems to launch so that each pool holds its number (see the module docstring)."""
    live = world.live
    # A new stem's imports compete for the same cores as a model that is loading to
    # serve a waiting request: refill only once no runner is starting for real work.
    if any(r.deployment and r.is_starting for r in live):
        return []
    # Stems forked from the fork server are ready at once; one spawned while it imports
    # would import the engine a second time, on the same cores.
    if world.warm is WarmState.STARTING:
        return []
    actions: list[Action] = []
    for pool in world.pools.values():
        stems = sum(
            r.deployment == ""
            and r.pool == pool.name
            and r.state in (RunnerState.STARTING, RunnerState.PREWARMED)
            for r in live
        )
        actions += [
            Launch(Tier.PREWARMED, pool=pool, gpus=pool.gpus) for _ in range(pool.stems - stems)
        ]
    return actions


def starts(actions: Sequence[Action]) -> int:
    return sum(isinstance(a, STARTS) for a in actions)


__all__ = [
    "Action",
    "AssignStem",
    "ClearBackoff",
    "Drain",
    "DropStem",
    "Launch",
    "MarkUnschedulable",
    "WakeSleeper",
    "plan",
]
