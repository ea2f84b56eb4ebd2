"""Typed records of GPUs and of the devices each runner holds (msgspec, kept in Redis).

`GpuDevice` is one GPU as NVML reports it (`ebb.gpus.nvml`); `HostInventory` is what one
host's NVML reports, refreshed by the controller; a `GpuPlacement` is what the controller
reserved for one runner before launching it: which devices of which host, how much of
each, and the `gpu_memory_utilization` its vLLM gets.
"""

from __future__ import annotations

import msgspec


class GpuDevice(msgspec.Struct, kw_only=True, frozen=True):
    """One GPU as NVML reports it (`ebb.gpus.nvml`): in a host's inventory, and in a
    runner's figures for /metrics. The one record of a GPU; memory in bytes."""

    index: int  # NVML's index, the number CUDA_VISIBLE_DEVICES names
    uuid: str
    name: str
    total_bytes: int
    free_bytes: int
    used_bytes: int = 0  # NVML's own figure (not always total less free)
    utilization_pct: int = 0
    temperature_c: int = 0


class HostInventory(msgspec.Struct, kw_only=True, frozen=True):
    host: str
    devices: list[GpuDevice] = []
    read_at_ms: int = 0
    # Why the host reports no GPUs when it does (NVML missing or failing); "" otherwise.
    note: str = ""


class GpuPlacement(msgspec.Struct, kw_only=True, frozen=True):
    """The devices one runner holds. Several runners may share a device (packing)."""

    host: str
    device_indexes: list[int]
    # Reserved on each device (the runner's need split evenly over its devices).
    reserved_bytes_per_device: int
    # The share of each device's total memory its vLLM may use.
    gpu_memory_utilization: float
    # Which weights it serves (a neighbour with other weights needs a larger margin).
    model_key: str = ""
    deployment: str = ""
    # What a sleeping runner of this placement keeps in host RAM (its offloaded weights).
    host_ram_bytes_asleep: int = 0
    # Its deployment's priority class: no other class is placed on its devices ("": a
    # record from before classes, standard).
    priority: str = ""

    @property
    def gpu_count(self) -> int:
        return len(self.device_indexes)

    @property
    def tensor_parallel_size(self) -> int:
        return len(self.device_indexes)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(i) for i in self.device_indexes)
