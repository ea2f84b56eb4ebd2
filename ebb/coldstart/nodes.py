"""Nodes a runner can land on, and which one it should: the placement half of launching.

A node is one machine of the cluster as a launcher sees it: its free GPUs, its warm
capacity (a fork server that already imported the engine, pre-warmed stems waiting there)
and the sources whose weights its node-local cache already holds. `rank_nodes` is the
whole placement preference, a pure function: a node that holds the weights first (a cold
start there skips the fetch, the slowest phase), then warm capacity, then free GPUs.

`rank_stems` is the same preference among the stems already waiting: a stem on a node
that holds the weights first, then the one whose pool spares the fewest GPUs.

`overall_warm_state` folds the nodes' warm capacity into the one `WarmState` the
controller and the frontdoor see (the tier the next launch gets).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ebb.coldstart.launcher import WarmState
from ebb.coldstart.stem_pools import StemPool
from ebb.queue.schema import RunnerRecord, RunnerState


@dataclass(frozen=True)
class Placement:
    """Where one runner goes: a node ("" lets the launcher's scheduler decide) and the
    GPU indices on it (empty: no GPU, or whichever the node's scheduler assigns)."""

    node: str = ""
    devices: tuple[int, ...] = ()


@dataclass(frozen=True)
class NodeCapacity:
    name: str
    free_gpus: int = 0
    warm: WarmState = WarmState.OFF  # the node's fork server, if it has one
    stems: int = 0  # pre-warmed runners waiting on this node
    cached_sources: frozenset[str] = field(default_factory=frozenset)
    schedulable: bool = True  # cordoned or not ready: nothing new lands there


def fits(node: NodeCapacity, gpus: int) -> bool:
    return node.schedulable and node.free_gpus >= gpus


def rank_nodes(nodes: Iterable[NodeCapacity], source: str, gpus: int) -> list[NodeCapacity]:
    """The nodes that can take a runner of `source` needing `gpus` GPUs, best first:
    holding the source's weights, then warm (a ready fork server, then stems), then the
    most free GPUs; ties by name, so the order is the same on every controller."""
    candidates = [n for n in nodes if fits(n, gpus)]
    return sorted(
        candidates,
        key=lambda n: (
            source not in n.cached_sources,
            n.warm is not WarmState.READY,
            -n.stems,
            -n.free_gpus,
            n.name,
        ),
    )


def choose_placement(
    nodes: Sequence[NodeCapacity], source: str, gpus: int, *, first_device: int = 0
) -> Placement | None:
    """The best node for the runner, or None when none fits (the launcher then leaves it
    to its scheduler, which queues it until capacity frees up). `first_device` is where
    the node's free GPUs start; exact device choice is the node-local placer's."""
    ranked = rank_nodes(nodes, source, gpus)
    if not ranked:
        return None
    return Placement(ranked[0].name, tuple(range(first_device, first_device + gpus)))


def overall_warm_state(nodes: Iterable[NodeCapacity]) -> WarmState:
    """READY if any schedulable node can fork a runner now; else STARTING if one is
    importing the engine; else DOWN if some node's fork server died; else OFF."""
    states = {n.warm for n in nodes if n.schedulable}
    for state in (WarmState.READY, WarmState.STARTING, WarmState.DOWN):
        if state in states:
            return state
    return WarmState.OFF


def rank_stems(
    stems: Iterable[RunnerRecord],
    pools: Mapping[str, StemPool],
    source: str,
    gpus: int,
    cached: Mapping[str, frozenset[str]],
) -> list[str]:
    """The waiting stems (PREWARMED, no deployment) that can become a runner of `source`
    needing `gpus` GPUs, best first: on a node whose cache holds the source, then in the
    pool with the fewest GPUs beyond the need, then the oldest; ties by id. A stem of a
    pool no longer configured counts as holding no GPUs."""

    def pool_of(stem: RunnerRecord) -> StemPool:
        return pools.get(stem.pool) or StemPool(stem.pool, 0)

    waiting = [
        s
        for s in stems
        if s.state is RunnerState.PREWARMED and not s.deployment and pool_of(s).serves(gpus)
    ]
    waiting.sort(
        key=lambda s: (
            source not in cached.get(s.node, frozenset()),
            pool_of(s).gpus - gpus,
            s.launched_ms,
            s.runner_id,
        )
    )
    return [s.runner_id for s in waiting]
