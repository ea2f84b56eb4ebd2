"""Checking a deployment's engine options (`EngineSpec`) before anything is stored.

What is accepted depends on the platform the deployment will run on: the GPUs the
hosts' inventories report (`GpuCapacity`), or none (CPU). Every refusal is an
`InvalidRequest` (400) whose message says what to change, with `param` naming the
option as the API spells it (`engine.dtype`, ...).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ebb.errors import InvalidRequest
from ebb.queue.gpu_records import HostInventory
from ebb.queue.schema import EngineSpec

GIB = 1024**3
DTYPES = ("auto", "float16", "bfloat16", "float32")
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
# A Kubernetes label value: what engine.accelerator is matched against on nodes.
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
MAX_HOST_MEMORY_GIB = 4096
# The quantization methods of vLLM 0.32 that run on each platform: on CUDA its GPU
# kernels (Marlin, FP8, ...); on CPU only the weight-only integer formats its CPU build
# has kernels for.
QUANTIZATION = {
    "cuda": (
        "awq",
        "awq_marlin",
        "gptq",
        "gptq_marlin",
        "fp8",
        "compressed-tensors",
        "modelopt",
        "mxfp4",
        "experts_int8",
        "moe_wna16",
        "torchao",
    ),
    "cpu": ("awq", "gptq", "compressed-tensors"),
}


@dataclass(frozen=True)
class GpuCapacity:
    """What the platform's hosts offer: most GPUs on one host, the largest device."""

    most_gpus_per_host: int = 0
    largest_device_bytes: int = 0

    @property
    def platform(self) -> str:
        return "cuda" if self.most_gpus_per_host else "cpu"

    @classmethod
    def of(cls, inventories: Iterable[HostInventory]) -> GpuCapacity:
        hosts = [i for i in inventories if i.devices]
        if not hosts:
            return cls()
        return cls(
            most_gpus_per_host=max(len(i.devices) for i in hosts),
            largest_device_bytes=max(d.total_bytes for i in hosts for d in i.devices),
        )


def check_engine(engine: EngineSpec, *, max_concurrency: int, capacity: GpuCapacity) -> None:
    """Raise `InvalidRequest` naming the first option this platform cannot honour."""
    _check_dtype(engine)
    _check_quantization(engine, capacity)
    _check_parallelism(engine, capacity)
    _check_memory(engine, capacity)
    _check_cluster_shape(engine)
    _check_lora(engine)
    if engine.max_num_seqs is not None and engine.max_num_seqs < max_concurrency:
        raise _invalid(
            f"engine.max_num_seqs ({engine.max_num_seqs}) is below max_concurrency "
            f"({max_concurrency}), the requests one runner feeds its engine: raise "
            "max_num_seqs or lower max_concurrency.",
            "max_num_seqs",
        )
    if engine.enforce_eager is False and capacity.platform == "cpu":
        raise _invalid(
            "engine.enforce_eager=false needs a GPU host; on CPU vLLM runs eagerly "
            "(its compiled mode answers incorrectly there): drop the option or set it true.",
            "enforce_eager",
        )


def _check_dtype(engine: EngineSpec) -> None:
    if engine.dtype is not None and engine.dtype not in DTYPES:
        raise _invalid(f"engine.dtype {engine.dtype!r} is not one of {', '.join(DTYPES)}.", "dtype")


def _check_quantization(engine: EngineSpec, capacity: GpuCapacity) -> None:
    if engine.quantization is None:
        return
    supported = QUANTIZATION[capacity.platform]
    if engine.quantization not in supported:
        raise _invalid(
            f"engine.quantization {engine.quantization!r} is not supported on this "
            f"platform ({capacity.platform}); use one of {', '.join(supported)}, or omit it "
            "to load the checkpoint as it is quantized.",
            "quantization",
        )


def _check_parallelism(engine: EngineSpec, capacity: GpuCapacity) -> None:
    size = engine.tensor_parallel_size
    if size is None:
        return
    if size not in TENSOR_PARALLEL_SIZES:
        raise _invalid(
            f"engine.tensor_parallel_size {size} is not one of "
            f"{', '.join(map(str, TENSOR_PARALLEL_SIZES))}.",
            "tensor_parallel_size",
        )
    most = capacity.most_gpus_per_host
    if size > 1 and size > most:
        where = (
            f"the largest host has {most} GPU{'s' if most != 1 else ''}"
            if most
            else ("no host reports a GPU")
        )
        raise _invalid(
            f"engine.tensor_parallel_size {size} needs {size} GPUs on one host, but {where}: "
            f"lower it to {max(s for s in TENSOR_PARALLEL_SIZES if s <= max(1, most))} or "
            "omit it.",
            "tensor_parallel_size",
        )


def _check_memory(engine: EngineSpec, capacity: GpuCapacity) -> None:
    budget = engine.gpu_memory_gib
    if budget is None:
        return
    if budget <= 0:
        raise _invalid("engine.gpu_memory_gib must be more than 0.", "gpu_memory_gib")
    if not capacity.largest_device_bytes:
        return  # CPU hosts: the budget applies once the deployment runs on GPUs
    devices = engine.tensor_parallel_size or 1
    per_device = budget * GIB / devices
    largest = capacity.largest_device_bytes
    if per_device > largest:
        raise _invalid(
            f"engine.gpu_memory_gib {budget:g} over {devices} GPU(s) is "
            f"{per_device / GIB:.1f} GiB per GPU, more than the largest GPU "
            f"({largest / GIB:.1f} GiB): lower it or raise tensor_parallel_size.",
            "gpu_memory_gib",
        )


def _check_cluster_shape(engine: EngineSpec) -> None:
    accelerator = engine.accelerator
    if accelerator is not None and not _LABEL_VALUE.fullmatch(accelerator):
        raise _invalid(
            f"engine.accelerator {accelerator[:80]!r} is not a node label value: at most 63 "
            "letters, digits, '-', '_' or '.', starting and ending with a letter or digit "
            "(e.g. NVIDIA-A100-SXM4-80GB).",
            "accelerator",
        )
    memory = engine.host_memory_gib
    if memory is not None and not 0 < memory <= MAX_HOST_MEMORY_GIB:
        raise _invalid(
            f"engine.host_memory_gib must be more than 0 and at most {MAX_HOST_MEMORY_GIB}.",
            "host_memory_gib",
        )


# LoRA (adapter deployments on a base): what enable_lora gives each limit left unset. Four
# adapters in one batch and sixteen kept loaded cost a 135M-8B base little memory (an
# adapter of rank 16 on the attention projections is a few MB); rank 16 is vLLM's default.
LORA_MAX_LORAS = 4
LORA_MAX_RANK = 16
LORA_MAX_CPU_LORAS = 16
# The ranks vLLM's LoRA kernels are built for (its `max_lora_rank` choices).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoraLimits:
    """A LoRA-enabled engine's limits: adapters per batch, highest rank, adapters kept."""

    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int


def lora_limits(engine: EngineSpec) -> LoraLimits | None:
    """The limits the engine runs LoRA with; None when LoRA is off."""
    if not engine.enable_lora:
        return None
    max_loras = engine.max_loras or LORA_MAX_LORAS
    return LoraLimits(
        max_loras=max_loras,
        max_lora_rank=engine.max_lora_rank or LORA_MAX_RANK,
        max_cpu_loras=max(engine.max_cpu_loras or LORA_MAX_CPU_LORAS, max_loras),
    )


def _check_lora(engine: EngineSpec) -> None:
    rank = engine.max_lora_rank
    if rank is not None and rank not in LORA_RANKS:
        raise _invalid(
            f"engine.max_lora_rank must be one of {', '.join(map(str, LORA_RANKS))} (the "
            f"ranks vLLM's LoRA kernels support); {rank} is not: pick the next one up.",
            "max_lora_rank",
        )
    given = engine.max_loras is not None or engine.max_cpu_loras is not None or rank is not None
    if given and not engine.enable_lora:
        raise _invalid(
            "engine.max_loras, max_lora_rank and max_cpu_loras apply to a LoRA base: set "
            "engine.enable_lora=true as well.",
            "enable_lora",
        )
    if engine.max_loras and engine.max_cpu_loras and engine.max_cpu_loras < engine.max_loras:
        raise _invalid(
            f"engine.max_cpu_loras ({engine.max_cpu_loras}) must be at least max_loras "
            f"({engine.max_loras}): the adapters in a batch are also kept loaded.",
            "max_cpu_loras",
        )


def _invalid(message: str, option: str) -> InvalidRequest:
    return InvalidRequest(message, param=f"engine.{option}")
