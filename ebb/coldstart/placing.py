"""Placement in front of a launcher that can place: each runner goes to the node
`placement.choose_placement` prefers (its weights already cached there, then warm capacity,
then free GPUs), as a preference its scheduler may still overrule.

`PreferringLauncher` is a `Launcher` the controller uses like any other; stems (no
deployment yet) and launches where nothing is known of the nodes go wherever the
scheduler puts them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Protocol

from ebb.coldstart.fork_client import Exit
from ebb.coldstart.placement import NodeCapacity, Placement, choose_placement
from ebb.launching.stem_pools import StemPool
from ebb.launching.tiers import Tier

log = logging.getLogger(__name__)


class PlacingLauncher(Protocol):
    """A `Launcher` that also knows its nodes and can launch onto one."""

    def launch(self, runner_id: str, deployment: str | None, tier: Tier) -> None: ...

    def launch_on(
        self, runner_id: str, deployment: str | None, tier: Tier, placement: Placement
    ) -> None: ...

    def nodes(self) -> list[NodeCapacity]: ...

    def launch_stem(self, runner_id: str, pool: StemPool) -> None: ...

    def poll(self) -> list[Exit]: ...

    def alive(self, runner_id: str) -> bool: ...

    def stop_all(self, grace_s: float) -> None: ...


class PreferringLauncher:
    def __init__(
        self,
        inner: PlacingLauncher,
        *,
        source_of: Callable[[str], str | None],
        gpus_for: Callable[[str | None], int],
        cached: Callable[[], dict[str, frozenset[str]]] = dict,
    ):
        """`source_of(deployment)`: its model source (None if unknown); `gpus_for`: the
        GPUs one of its runners needs; `cached()`: {node: sources} the nodes' prefetchers
        published (in Redis), added to what the launcher knows of each node."""
        self._inner = inner
        self._source_of = source_of
        self._gpus_for = gpus_for
        self._cached = cached

    def launch(self, runner_id: str, deployment: str | None, tier: Tier) -> None:
        self._inner.launch_on(runner_id, deployment, tier, self.placement_for(deployment))

    def placement_for(self, deployment: str | None) -> Placement:
        if deployment is None:
            return Placement()  # a stem: it loads whatever it is assigned, wherever it is
        try:
            source = self._source_of(deployment)
            nodes = self._nodes() if source else []
        except Exception:  # placement is a preference: never a reason not to launch
            log.exception("coldstart: could not read the nodes; placing %s anywhere", deployment)
            return Placement()
        chosen = choose_placement(nodes, source or "", self._gpus_for(deployment))
        return chosen or Placement()

    def _nodes(self) -> list[NodeCapacity]:
        published = self._cached()
        return [
            dataclasses.replace(n, cached_sources=n.cached_sources | published.get(n.name, set()))
            for n in self._inner.nodes()
        ]

    def launch_stem(self, runner_id: str, pool: StemPool) -> None:
        self._inner.launch_stem(runner_id, pool)

    def poll(self) -> list[Exit]:
        return self._inner.poll()

    def alive(self, runner_id: str) -> bool:
        return self._inner.alive(runner_id)

    def stop_all(self, grace_s: float) -> None:
        self._inner.stop_all(grace_s)
