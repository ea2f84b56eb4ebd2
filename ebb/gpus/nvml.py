"""The one NVML read: each GPU as a `GpuDevice` (memory in bytes).

`nvidia-ml-py` is imported lazily and guarded: a host without it, without a driver or
without GPUs simply has none. Two callers: the controller's inventory reads every device
of its host once per refresh (`read_devices`); a runner's /metrics figures read the devices
`CUDA_VISIBLE_DEVICES` leaves it, once a second (`reader`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from ebb.gpus.visible import visible_indices
from ebb.queue.gpu_records import GpuDevice

log = logging.getLogger(__name__)


class NvmlUnavailable(RuntimeError):
    """No NVML on this host (no driver or no library): it has no GPUs to offer."""


def read_devices() -> list[GpuDevice]:
    """Every GPU the driver reports (all of them, whatever CUDA_VISIBLE_DEVICES says).

    Raises `NvmlUnavailable` with the reason when NVML is missing or fails."""
    nvml = _nvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        raise NvmlUnavailable(f"NVML: {e}") from e
    try:
        return [device(nvml, i) for i in range(nvml.nvmlDeviceGetCount())]
    except nvml.NVMLError as e:
        raise NvmlUnavailable(f"NVML: {e}") from e
    finally:
        nvml.nvmlShutdown()


def reader(environ: Mapping[str, str] | None = None) -> Callable[[], list[GpuDevice]]:
    """A callable that reads this process's visible GPUs each time it is called (NVML stays
    initialised between calls); one that reports none on a host without NVML."""
    try:
        nvml = _nvml()
    except NvmlUnavailable:
        return list
    try:
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError:
        return list
    indices = visible_indices(count, environ)
    if not indices:
        return list

    def read() -> list[GpuDevice]:
        try:
            return [device(nvml, i) for i in indices]
        except nvml.NVMLError as e:  # a GPU fell off the bus: say so once a second
            log.warning("runner: reading GPU figures failed: %s", e)
            return []

    return read


def device(nvml: Any, index: int) -> GpuDevice:
    """The record of device `index`, read through the `pynvml` module `nvml`."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
    name = nvml.nvmlDeviceGetName(handle)
    uuid = nvml.nvmlDeviceGetUUID(handle)
    return GpuDevice(
        index=index,
        uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
        name=name.decode() if isinstance(name, bytes) else str(name),
        total_bytes=int(memory.total),
        free_bytes=int(memory.free),
        used_bytes=int(memory.used),
        utilization_pct=int(utilization.gpu),
        temperature_c=int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
    )


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnavailable("nvidia-ml-py is not installed") from e
    return pynvml
