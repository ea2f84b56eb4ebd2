"""How many GPUs: the ones this process can use, and the ones a runner holds.

Two questions, one answer each:
- `visible_gpu_count`: the devices this process can compute on (NVML's, narrowed by
  `CUDA_VISIBLE_DEVICES`); 0 on a host without GPUs. It decides CPU-or-GPU behaviour.
- `held_gpus`: the devices a runner holds, which is what it is billed for: its placement's
  devices (the controller reserved them before launching or assigning it, and the runner
  narrows `CUDA_VISIBLE_DEVICES` to them), else the count its launcher named in
  `EBB_RUNNER_GPUS` (a Kubernetes pod's: the device plugin gives the container its
  devices without setting `CUDA_VISIBLE_DEVICES`), else the devices named in
  `CUDA_VISIBLE_DEVICES` (a Ray actor's). None of them names none: a CPU runner, or a
  stem not yet assigned, sees every device of its host but holds none of them.
  `billed_gpus` applies billing's one rule on top: a runner holding none counts as one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ebb.gpus.nvml import NvmlUnavailable, read_devices
from ebb.gpus.visible import visible_devices, visible_indices
from ebb.queue.gpu_records import GpuPlacement

# The number of devices a launcher gave a runner whose devices it does not name in
# CUDA_VISIBLE_DEVICES (a Kubernetes pod's `nvidia.com/gpu` request).
HELD_GPUS_ENV = "EBB_RUNNER_GPUS"


def visible_gpu_count(environ: Mapping[str, str] | None = None) -> int:
    """GPUs this process may use, without initialising CUDA; 0 on a host without NVML."""
    if visible_devices(environ) == []:
        return 0  # hidden: no need to ask NVML
    try:
        count = len(read_devices())
    except NvmlUnavailable:
        return 0
    return len(visible_indices(count, environ))


def held_gpus(placement: GpuPlacement | None, environ: Mapping[str, str] | None = None) -> int:
    """The GPUs a runner holds: its placement's, else its launcher's `EBB_RUNNER_GPUS`,
    else those `CUDA_VISIBLE_DEVICES` names (see the module docstring); 0 for none."""
    if placement is not None:
        return placement.gpu_count
    named = (os.environ if environ is None else environ).get(HELD_GPUS_ENV, "")
    if named.isdigit() and int(named) > 0:
        return int(named)
    return len(visible_devices(environ) or [])


def billed_gpus(held: int) -> int:
    """The GPUs a runner is billed for, holding `held`: a CPU runner counts as one."""
    return max(1, held)
