"""Where a runner goes: which node, then which devices on it. Pure functions; one rule
runs through both: a place that already holds the runner's weights comes first (a cold
start there skips the fetch, the slowest phase).

Nodes (for launchers whose scheduler places pods or actors: Kubernetes, Ray). A node is
one machine as a launcher sees it: its free GPUs, its warm capacity (a fork server that
already imported the engine, pre-warmed stems waiting there) and the sources its
node-local cache holds (its prefetcher's word). `rank_nodes`: holding the weights, then
warm capacity, then free GPUs; `rank_stems`: the same among stems already waiting, then
the pool sparing the fewest GPUs. `overall_warm_state` folds the nodes' warm capacity
into the one `WarmState` the controller and the frontdoor see.

Devices (for a host whose GPUs the controller places on itself: `place`). A runner needs
its weights, a KV-cache budget and a reserve for activations and CUDA graphs (`GpuNeed`,
estimated by `gpu_need`). It is placed only on a device whose free memory exceeds that
need by `MARGIN_SAME` (20 %), or by `MARGIN_OTHER` (40 %) when the device already serves
a different model: a neighbour's KV cache growing must not push either into swapping.
Nor is it placed on a device an awake runner of another priority class uses: only
services of the same priority share a GPU (`ebb.queue.priority`).
Free memory is the smaller of what NVML last reported and the device's total less what
live runners reserved (a runner still loading has not taken its memory yet). A sleeping
runner (vLLM sleep level 1: weights offloaded to host RAM, KV dropped) reserves only its
CUDA context.

Several small runners pack onto one device (best fit: the device left with the least
free memory that still fits, so large devices stay free for large models), on a host
holding the weights first. A model larger than any one device is split with tensor
parallelism over N devices of one host (N a power of two), or over the N the deployment
asked for. When nothing fits, the answer says why with the numbers, e.g. "needs 14.2 GiB
+ 20 %, largest free 11.0 GiB on GPU 1".
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ebb.launching.stem_pools import StemPool
from ebb.launching.tiers import WarmState
from ebb.queue.gpu_records import GpuDevice, GpuPlacement, HostInventory
from ebb.queue.priority import class_name
from ebb.queue.schema import RunnerRecord, RunnerState

# --- nodes ---------------------------------------------------------------------------------


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
    gpus: float,
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


# --- devices on a host ----------------------------------------------------------------

GIB = 1024**3
MARGIN_SAME = 1.2
MARGIN_OTHER = 1.4
# What a sleeping runner keeps on its device: its CUDA context and allocator pools.
ASLEEP_RESIDUAL_BYTES = 512 * 1024**2
TP_SIZES = (1, 2, 4, 8)
# vLLM refuses a memory share it cannot use; a runner never asks for more than this.
MAX_UTILIZATION = 0.95


@dataclass(frozen=True)
class GpuNeed:
    """What one runner takes on its devices, in total over all of them."""

    weights_bytes: int
    kv_cache_bytes: int
    reserve_bytes: int
    model_key: str = ""
    # Host RAM a sleeping runner of this model holds (its weights, offloaded).
    host_ram_asleep_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.reserve_bytes

    def per_device_bytes(self, devices: int) -> int:
        # Weights and KV split over the TP group; each rank keeps its own reserve.
        split = math.ceil((self.weights_bytes + self.kv_cache_bytes) / devices)
        return split + self.reserve_bytes


@dataclass(frozen=True)
class Held:
    """A live runner's placement, and whether it sleeps (then it holds only a residue)."""

    placement: GpuPlacement
    asleep: bool = False


@dataclass(frozen=True)
class Placed:
    placement: GpuPlacement


@dataclass(frozen=True)
class Refused:
    reason: str


@dataclass(frozen=True)
class NoGpus:
    """No host reports a GPU: the runner starts on CPU, as it always has."""


PlacementResult = Placed | Refused | NoGpus


@dataclass(frozen=True)
class _Slot:
    """One device as placement sees it."""

    host: str
    device: GpuDevice
    available_bytes: int
    models: frozenset[str]
    # The priority classes of the awake runners on it.
    priorities: frozenset[str] = frozenset()

    def margin_for(self, model_key: str) -> float:
        return MARGIN_OTHER if self.models - {model_key} else MARGIN_SAME

    def shares_with(self, priority: str) -> bool:
        """Whether a runner of `priority` may join this device's runners."""
        return not self.priorities - {class_name(priority)}

    def fits(self, need_bytes: int, model_key: str, priority: str = "") -> bool:
        return self.shares_with(priority) and (
            self.available_bytes > need_bytes * self.margin_for(model_key)
        )


def place(
    need: GpuNeed,
    inventories: Sequence[HostInventory],
    held: Iterable[Held] = (),
    *,
    tensor_parallel_size: int | None = None,
    deployment: str = "",
    holding: Collection[str] = (),
    priority: str = "",
) -> PlacementResult:
    """Where a runner with `need` goes, given every host's devices and what live runners
    hold. `tensor_parallel_size` None lets placement split a model too large for any one
    device; a number pins the split. `holding`: the hosts whose cache holds the weights,
    preferred over a tighter fit elsewhere. `priority`: its deployment's class; only
    devices no awake runner of another class uses are considered."""
    slots = _slots(inventories, list(held))
    if not slots:
        return NoGpus()
    sizes = _sizes(need, slots, tensor_parallel_size)
    for size in sizes:
        chosen = _choose(need, slots, size, holding, priority)
        if chosen is not None:
            return Placed(_placement(need, chosen, deployment, priority))
    return Refused(_refusal(need, slots, sizes[-1], priority))


def _slots(inventories: Sequence[HostInventory], held: list[Held]) -> list[_Slot]:
    reserved: dict[tuple[str, int], int] = {}
    models: dict[tuple[str, int], set[str]] = {}
    classes: dict[tuple[str, int], set[str]] = {}
    for h in held:
        p = h.placement
        for index in p.device_indexes:
            key = (p.host, index)
            taken = ASLEEP_RESIDUAL_BYTES if h.asleep else p.reserved_bytes_per_device
            reserved[key] = reserved.get(key, 0) + taken
            if not h.asleep:
                models.setdefault(key, set()).add(p.model_key)
                classes.setdefault(key, set()).add(class_name(p.priority))
    slots = []
    for inventory in inventories:
        for device in inventory.devices:
            key = (inventory.host, device.index)
            by_reservation = device.total_bytes - reserved.get(key, 0)
            available = max(0, min(device.free_bytes, by_reservation))
            slots.append(
                _Slot(
                    inventory.host,
                    device,
                    available,
                    frozenset(models.get(key, ())),
                    frozenset(classes.get(key, ())),
                )
            )
    return slots


def _sizes(need: GpuNeed, slots: list[_Slot], requested: int | None) -> list[int]:
    """TP sizes to try, smallest first: the requested one, or 1 and, for a model that
    fits no single device even when empty, the larger ones a host has devices for."""
    if requested is not None:
        return [requested]
    largest_total = max(s.device.total_bytes for s in slots)
    if largest_total > need.total_bytes * MARGIN_SAME:
        return [1]
    per_host: dict[str, int] = {}
    for s in slots:
        per_host[s.host] = per_host.get(s.host, 0) + 1
    most = max(per_host.values())
    return [size for size in TP_SIZES if size <= most]


def _choose(
    need: GpuNeed,
    slots: list[_Slot],
    size: int,
    holding: Collection[str] = (),
    priority: str = "",
) -> list[_Slot] | None:
    """The tightest-fitting `size` devices of one host, on a host in `holding` if one
    fits; or None."""
    per_device = need.per_device_bytes(size)
    best: list[_Slot] | None = None
    for host in sorted({s.host for s in slots}):
        fitting = sorted(
            (s for s in slots if s.host == host and s.fits(per_device, need.model_key, priority)),
            key=lambda s: (s.available_bytes, s.device.index),
        )
        if len(fitting) < size:
            continue
        group = fitting[:size]
        if best is None or _rank(group, holding) < _rank(best, holding):
            best = group
    return best


def _rank(group: list[_Slot], holding: Collection[str]) -> tuple[bool, int]:
    return group[0].host not in holding, _left(group)


def _left(group: list[_Slot]) -> int:
    return sum(s.available_bytes for s in group)


def _placement(
    need: GpuNeed, group: list[_Slot], deployment: str, priority: str = ""
) -> GpuPlacement:
    per_device = need.per_device_bytes(len(group))
    smallest_total = min(s.device.total_bytes for s in group)
    # Rounded up to a hundredth: vLLM's budget must cover the need, never fall short of it.
    share = min(MAX_UTILIZATION, math.ceil(per_device / smallest_total * 100) / 100)
    return GpuPlacement(
        host=group[0].host,
        device_indexes=sorted(s.device.index for s in group),
        reserved_bytes_per_device=per_device,
        gpu_memory_utilization=share,
        model_key=need.model_key,
        deployment=deployment,
        host_ram_bytes_asleep=need.host_ram_asleep_bytes,
        priority=class_name(priority),
    )


def gib(n_bytes: int) -> str:
    return f"{n_bytes / GIB:.1f} GiB"


def _refusal(need: GpuNeed, slots: list[_Slot], size: int, priority: str = "") -> str:
    """Why nothing fits, with the numbers of the device that came closest."""
    shareable = [s for s in slots if s.shares_with(priority)]
    if not shareable:
        return (
            f"every GPU serves another priority class than {class_name(priority)!r}, and "
            "only services of the same priority share a GPU"
        )
    largest = max(shareable, key=lambda s: (s.available_bytes, -s.device.index))
    margin = largest.margin_for(need.model_key)
    pct = round((margin - 1) * 100)
    beside = " beside another model" if margin == MARGIN_OTHER else ""
    where = f"GPU {largest.device.index}"
    if len({s.host for s in slots}) > 1:
        where += f" of {largest.host}"
    amount = gib(need.per_device_bytes(size))
    if size > 1:
        amount = f"{size} × {amount} on one host"
    return (
        f"needs {amount} + {pct} %{beside}, largest free {gib(largest.available_bytes)} on {where}"
    )
