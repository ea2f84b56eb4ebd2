"""Where a runner's GPU memory comes from: a pure function of a need and an inventory.

A runner needs its weights, a KV-cache budget and a reserve for activations and CUDA
graphs (`GpuNeed`, estimated by `gpu_need`). It is placed only on a device whose free
memory exceeds that need by `MARGIN_SAME` (20 %), or by `MARGIN_OTHER` (40 %) when the
device already serves a different model: a neighbour's KV cache growing must not push
either into swapping. Free memory is the smaller of what NVML last reported and the
device's total less what live runners reserved (a runner still loading has not taken its
memory yet). A sleeping runner (vLLM sleep level 1: weights offloaded to host RAM, KV
dropped) reserves only its CUDA context.

Several small runners pack onto one device (best fit: the device left with the least
free memory that still fits, so large devices stay free for large models). A model
larger than any one device is split with tensor parallelism over N devices of one host
(N a power of two), or over the N the deployment asked for. When nothing fits, the
answer says why with the numbers, e.g. "needs 14.2 GiB + 20 %, largest free 11.0 GiB on
GPU 1".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ebb.queue.gpu_records import GpuDevice, GpuPlacement, HostInventory

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

    def margin_for(self, model_key: str) -> float:
        return MARGIN_OTHER if self.models - {model_key} else MARGIN_SAME

    def fits(self, need_bytes: int, model_key: str) -> bool:
        return self.available_bytes > need_bytes * self.margin_for(model_key)


def place(
    need: GpuNeed,
    inventories: Sequence[HostInventory],
    held: Iterable[Held] = (),
    *,
    tensor_parallel_size: int | None = None,
    deployment: str = "",
) -> PlacementResult:
    """Where a runner with `need` goes, given every host's devices and what live runners
    hold. `tensor_parallel_size` None lets placement split a model too large for any one
    device; a number pins the split."""
    slots = _slots(inventories, list(held))
    if not slots:
        return NoGpus()
    sizes = _sizes(need, slots, tensor_parallel_size)
    for size in sizes:
        chosen = _choose(need, slots, size)
        if chosen is not None:
            return Placed(_placement(need, chosen, deployment))
    return Refused(_refusal(need, slots, sizes[-1]))


def _slots(inventories: Sequence[HostInventory], held: list[Held]) -> list[_Slot]:
    reserved: dict[tuple[str, int], int] = {}
    models: dict[tuple[str, int], set[str]] = {}
    for h in held:
        p = h.placement
        for index in p.device_indexes:
            key = (p.host, index)
            taken = ASLEEP_RESIDUAL_BYTES if h.asleep else p.reserved_bytes_per_device
            reserved[key] = reserved.get(key, 0) + taken
            if not h.asleep:
                models.setdefault(key, set()).add(p.model_key)
    slots = []
    for inventory in inventories:
        for device in inventory.devices:
            key = (inventory.host, device.index)
            by_reservation = device.total_bytes - reserved.get(key, 0)
            available = max(0, min(device.free_bytes, by_reservation))
            slots.append(_Slot(inventory.host, device, available, frozenset(models.get(key, ()))))
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


def _choose(need: GpuNeed, slots: list[_Slot], size: int) -> list[_Slot] | None:
    """The tightest-fitting `size` devices of one host, or None."""
    per_device = need.per_device_bytes(size)
    best: list[_Slot] | None = None
    for host in sorted({s.host for s in slots}):
        fitting = sorted(
            (s for s in slots if s.host == host and s.fits(per_device, need.model_key)),
            key=lambda s: (s.available_bytes, s.device.index),
        )
        if len(fitting) < size:
            continue
        group = fitting[:size]
        if best is None or _left(group) < _left(best):
            best = group
    return best


def _left(group: list[_Slot]) -> int:
    return sum(s.available_bytes for s in group)


def _placement(need: GpuNeed, group: list[_Slot], deployment: str) -> GpuPlacement:
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
    )


def gib(n_bytes: int) -> str:
    return f"{n_bytes / GIB:.1f} GiB"


def _refusal(need: GpuNeed, slots: list[_Slot], size: int) -> str:
    """Why nothing fits, with the numbers of the device that came closest."""
    largest = max(slots, key=lambda s: (s.available_bytes, -s.device.index))
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
