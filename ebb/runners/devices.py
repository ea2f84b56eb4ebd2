"""GPUs as NVML sees them, and keeping CUDA uninitialised in processes that fork.

A CUDA context does not survive `fork()`: a child of a process that initialised CUDA
fails on its first CUDA call. The fork server and pre-warmed stems therefore learn about
devices only through NVML (`nvidia-ml-py`, imported lazily, guarded: a CPU host simply
has none), never through `torch.cuda`, and torch's own availability check is switched to
NVML too (`PYTORCH_NVML_BASED_CUDA_CHECK`, set by `vllm_compat`). A runner sets
`CUDA_VISIBLE_DEVICES` from its placement before its engine first touches CUDA.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from ebb.queue.gpu_records import GpuDevice, GpuPlacement

log = logging.getLogger(__name__)

VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
_HIDDEN = ("-1", "NoDevFiles")


class NvmlUnavailable(RuntimeError):
    """No NVML on this host (no driver or no library): it has no GPUs to offer."""


def read_nvml_devices() -> list[GpuDevice]:
    """Every GPU the driver reports (all of them, whatever CUDA_VISIBLE_DEVICES says).

    Raises `NvmlUnavailable` with the reason when NVML is missing or fails."""
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnavailable("nvidia-ml-py is not installed") from e
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(f"NVML: {e}") from e
    try:
        return [_device(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(f"NVML: {e}") from e
    finally:
        pynvml.nvmlShutdown()


def _device(nvml: Any, index: int) -> GpuDevice:
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
        utilization_pct=int(utilization.gpu),
        temperature_c=int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
    )


def visible_indices(count: int, environ: Mapping[str, str] | None = None) -> list[int]:
    """The NVML indices of the `count` GPUs this process may use: all of them unless
    CUDA_VISIBLE_DEVICES narrows them; none when it hides them. Devices named by UUID
    cannot be matched to indices without CUDA, so they stand for the first ones."""
    env = os.environ if environ is None else environ
    visible = env.get(VISIBLE_DEVICES_ENV)
    if visible is None:
        return list(range(count))
    names = [n.strip() for n in visible.split(",") if n.strip()]
    if not names or names[0] in _HIDDEN:
        return []
    if all(n.isdigit() for n in names):
        return [int(n) for n in names if int(n) < count]
    return list(range(min(count, len(names))))


def visible_gpu_count(environ: Mapping[str, str] | None = None) -> int:
    """GPUs this process may use, without initialising CUDA; 0 on a host without NVML."""
    env = os.environ if environ is None else environ
    if env.get(VISIBLE_DEVICES_ENV) is not None and not visible_indices(1, env):
        return 0  # hidden: no need to ask NVML
    try:
        count = len(read_nvml_devices())
    except NvmlUnavailable:
        return 0
    return len(visible_indices(count, env))


def cuda_initialized() -> bool:
    """Whether this process holds a CUDA context (never imports torch to find out)."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def fork_unsafe_reason() -> str | None:
    """Why forking this process would hand children a broken CUDA context, or None."""
    if cuda_initialized():
        return (
            "CUDA was initialised in this process before forking (a torch.cuda call "
            "outside NVML's check); forked runners would fail on their first CUDA call"
        )
    return None


def use_placement(placement: GpuPlacement) -> None:
    """Restrict this process to its placement's devices; before CUDA is initialised.

    Raises RuntimeError when CUDA already is: the process would use the wrong devices."""
    if cuda_initialized():
        raise RuntimeError(
            f"cannot restrict this runner to GPUs {placement.cuda_visible_devices}: CUDA "
            "is already initialised in it"
        )
    os.environ[VISIBLE_DEVICES_ENV] = placement.cuda_visible_devices
    log.info(
        "runner: on GPUs %s of %s (%.2f of each device's memory)",
        placement.cuda_visible_devices,
        placement.host,
        placement.gpu_memory_utilization,
    )
