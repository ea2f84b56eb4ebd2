"""The figures of this runner's GPUs (utilisation, memory, temperature) through NVML.

For /metrics only: `reader()` returns a callable the serving loop calls once a second;
on a host without NVML (no driver, no `nvidia-ml-py`, a CPU machine) it returns one that
reports no GPUs. NVML never initialises CUDA, so reading it is safe in any process. The
GPUs read are those CUDA_VISIBLE_DEVICES leaves visible (`devices.visible_indices`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ebb.queue.observations import GpuFigures
from ebb.runners import devices

log = logging.getLogger(__name__)


def reader(environ: dict[str, str] | None = None) -> Callable[[], list[GpuFigures]]:
    try:
        import pynvml
    except ImportError:
        return list
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError:
        return list
    indices = devices.visible_indices(count, environ)
    if not indices:
        return list

    def read() -> list[GpuFigures]:
        try:
            return [_figures(pynvml, i) for i in indices]
        except pynvml.NVMLError as e:  # a GPU fell off the bus: say so once a second
            log.warning("runner: reading GPU figures failed: %s", e)
            return []

    return read


def _figures(nvml: Any, index: int) -> GpuFigures:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    return GpuFigures(
        index=index,
        utilization_ratio=nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100,
        memory_used_bytes=int(memory.used),
        memory_total_bytes=int(memory.total),
        temperature_c=float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
    )
