"""What the controller knows at one reconcile, as one frozen snapshot (`World`), and the
types it is made of. `plan.plan` decides from a `World` alone; `world_reader.read_world`
builds one from the platform's state, the launcher and this host's GPUs.

Nothing here reads or writes anything: a test builds a `World` by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ebb.coldstart.placement import GpuNeed, NodeCapacity
from ebb.launching.stem_pools import StemPool
from ebb.launching.tiers import WarmState
from ebb.queue.gpu_records import GpuPlacement, HostInventory
from ebb.queue.schema import DeploymentSpec, RunnerRecord, RunnerState


@dataclass(frozen=True)
class Backoff:
    """Failed starts in a row of one deployment, and when the next start may be tried
    (on the controller's monotonic clock). Kept in the controller's memory."""

    failures: int = 0
    next_try_s: float = 0.0


@dataclass(frozen=True)
class Demand:
    """One serving unit (a deployment version) and what it asks of the controller now."""

    spec: DeploymentSpec
    queue_depth: int = 0  # queued synchronous requests
    job_depth: int = 0  # queued async job attempts: demand like requests
    oldest_wait_s: float = 0.0
    # The class of its most urgent waiting request ("": none): orders cold starts.
    head_priority: str = ""
    ready: int = 0
    starting: int = 0  # launched, loading, or woken and not ready yet
    # Its sleeping runners (not being woken): the fastest start there is.
    sleepers: tuple[str, ...] = ()
    backoff: Backoff | None = None
    # What one of its runners takes on a GPU; None while its weights are not prepared (or
    # where nothing is to be placed: no GPUs, no start possible, nothing to recheck).
    gpu_need: GpuNeed | None = None
    # The GPUs one runner asks of a cluster node (its engine's tensor parallel size, or the
    # cluster launcher's default); 0 locally.
    node_gpus: int = 0

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class Gpus:
    """This platform's GPUs as the controller places on them itself (local hosts)."""

    inventories: tuple[HostInventory, ...] = ()
    placements: Mapping[str, GpuPlacement] = field(default_factory=dict)
    # {deployment: why it is unschedulable} as last shown; None before the first reconcile
    # of this controller (then whatever an earlier one showed is cleared).
    shown_unschedulable: Mapping[str, str] | None = None
    # The host this controller runs on, and its budget of host RAM for sleepers' weights.
    host: str = ""
    sleep_budget_bytes: int | None = None

    @property
    def present(self) -> bool:
        return any(i.devices for i in self.inventories)


@dataclass(frozen=True)
class World:
    """Everything `plan` decides from."""

    demands: tuple[Demand, ...] = ()
    # Every runner record after this reconcile's exits were collected (dead ones included,
    # until they are forgotten): oldest launch first.
    runners: tuple[RunnerRecord, ...] = ()
    # Waiting stems whose process is gone (neither the launcher nor a heartbeat vouches).
    dead_stems: frozenset[str] = frozenset()
    pools: Mapping[str, StemPool] = field(default_factory=dict)
    node_caches: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # A cluster launcher's nodes (caches merged in); None: the launcher has no nodes to
    # choose from (local processes), or none needed reading this time.
    nodes: tuple[NodeCapacity, ...] | None = None
    warm: WarmState = WarmState.OFF
    gpus: Gpus | None = None
    now_s: float = 0.0  # the controller's monotonic clock

    @property
    def live(self) -> list[RunnerRecord]:
        return [r for r in self.runners if r.state.is_live]

    @property
    def waiting_stems(self) -> list[RunnerRecord]:
        return [r for r in self.live if r.state is RunnerState.PREWARMED and not r.deployment]


def serves(runner: RunnerRecord, spec: DeploymentSpec) -> bool:
    """Launched for this unit of this deployment: not an earlier one's of the same name."""
    return runner.deployment == spec.name and runner.deployment_uid == spec.uid
