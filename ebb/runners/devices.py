"""Keeping CUDA uninitialised in processes that fork, and a runner on its placement's GPUs.

A CUDA context does not survive `fork()`: a child of a process that initialised CUDA
fails on its first CUDA call. The fork server and pre-warmed stems therefore learn about
devices only through NVML (`ebb.gpus`), never through `torch.cuda`, and torch's own
availability check is switched to NVML too (`PYTORCH_NVML_BASED_CUDA_CHECK`, set by
`engine_patches`). A runner sets
`CUDA_VISIBLE_DEVICES` from its placement before its engine first touches CUDA.
"""

from __future__ import annotations

import logging
import os
import sys

from ebb.gpus.visible import VISIBLE_DEVICES_ENV
from ebb.queue.gpu_records import GpuPlacement

log = logging.getLogger(__name__)


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
