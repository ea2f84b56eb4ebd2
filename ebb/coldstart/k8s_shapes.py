"""What one runner pod of a deployment asks of its node (`k8s_pods.RunnerShape`).

GPUs: its engine's tensor parallel size, else the platform default (`runner_gpus`).
Memory: what the process holds in host RAM, not a constant — the engine's own
(EBB_K8S_RUNNER_MEMORY_BASE_BYTES: Python, torch, vLLM) plus the model's weights (a GPU
runner asleep holds them offloaded; a CPU runner serves from them) plus, on CPU, its KV
cache; a deployment's `engine.host_memory_gib` replaces the estimate. Weights not in the
controller's cache yet leave it to the template (None). Accelerator: the deployment's
`engine.accelerator`, matched to a node label by the pod.
"""

from __future__ import annotations

import math

from ebb.coldstart.gpu_need import estimate_need
from ebb.coldstart.k8s_pods import GIB, RunnerShape
from ebb.config import Settings
from ebb.engines import EngineRegistry
from ebb.launching.stem_pools import runner_gpus
from ebb.queue.schema import DeploymentSpec


def runner_shape(
    settings: Settings, engines: EngineRegistry, spec: DeploymentSpec | None
) -> RunnerShape:
    """The shape of one runner of `spec`; a stem (None) the template's."""
    if spec is None:
        return RunnerShape()
    gpus = math.ceil(runner_gpus(spec, settings.k8s_gpus_per_runner))  # whole devices
    return RunnerShape(
        gpus=gpus,
        memory_bytes=runner_memory_bytes(settings, engines, spec, gpus=gpus),
        accelerator=spec.engine.accelerator or "",
    )


def runner_memory_bytes(
    settings: Settings, engines: EngineRegistry, spec: DeploymentSpec, *, gpus: int
) -> int | None:
    if spec.engine.host_memory_gib is not None:
        return math.ceil(spec.engine.host_memory_gib * GIB)
    need = estimate_need(settings, engines, spec)
    if need is None:
        return None
    held = need.host_ram_asleep_bytes or need.weights_bytes
    kv_cache = 0 if gpus else settings.kv_cache_gib * GIB
    return settings.k8s_runner_memory_base_bytes + held + kv_cache
