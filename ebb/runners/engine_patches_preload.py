"""The vLLM patches applied once its modules are imported, while a stem waits
(`apply_preload`): changes to vLLM's attributes that every engine this process builds reads.

The machinery (`Patch`, `apply`, the record) is `engine_patches`; vLLM is imported only
inside functions.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Callable
from typing import Any

from ebb.runners.engine_patches import Patch, apply, callable_with


def _current_platform() -> Any:
    from vllm.platforms import current_platform

    return current_platform


def _already_done() -> None:
    return None


def _register_kernel_overrides_once() -> None:
    platform = _current_platform()
    platform.register_triton_kernel_overrides()
    platform.register_triton_kernel_overrides = _already_done


# vLLM's CPU stand-ins for its Triton kernels, installed once while the stem waits. Engine
# init installs them (`init_worker`) by scanning every attribute of every loaded module for
# references to the kernels, ~0.25 s on 2 cores, and would wrap the wrappers if called twice
# in one process. The kernels' modules are imported by the preload, and modules imported
# later read the replaced attributes, so once per process is enough. Required: the guard
# is what keeps a second registration from wrapping the stand-ins again, and a vLLM whose
# registration looks different may register differently; better a runner that fails with
# the reason than one that computes through kernels wrapped twice.
KERNEL_OVERRIDES_ONCE = Patch(
    name="kernel-overrides-once",
    required=True,
    check=lambda: callable_with(_current_platform(), "register_triton_kernel_overrides", ()),
    install=_register_kernel_overrides_once,
    without="engine init would register the kernel stand-ins a second time, over the first",
)


def _logging_check() -> str | None:
    from vllm import logger as vllm_logger
    from vllm.engine.arg_utils import EngineArgs

    return callable_with(vllm_logger, "configure_logging_if_needed", ("config",)) or (
        callable_with(EngineArgs, "create_logging_config", ("self",))
    )


def _configure_logging() -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.logger import configure_logging_if_needed

    configure_logging_if_needed(EngineArgs().create_logging_config())


# vLLM's logging configuration applied while the stem waits. Every engine init applies it
# unless the same configuration is already active, and `dictConfig` walks every logger that
# the imports created (~0.06 s). Optional: a speed-up; engine init configures it anyway.
LOGGING_CONFIGURED_EARLY = Patch(
    name="logging-configured-early",
    required=False,
    check=_logging_check,
    install=_configure_logging,
    without="engine init configures vLLM's logging itself (~0.06 s)",
)


def _renderer_module() -> Any:
    import vllm.renderers.hf as hf_renderer

    return hf_renderer


def _renderer_base_module() -> Any:
    import vllm.renderers.base as renderer_base

    return renderer_base


# Where the tokenizer's EOS id is kept, read before the pool wraps the tokenizer.
_EOS_ID_ATTRIBUTE = "_ebb_eos_token_id"


def _copies_on_demand() -> None:
    hf_renderer = _renderer_module()
    make_pool = hf_renderer.maybe_make_thread_pool

    def copies_on_demand(tokenizer: Any, copies: int = 1) -> Any:
        with contextlib.suppress(AttributeError, TypeError):  # no such id, or no __dict__
            # Read now: once the pool wraps the tokenizer, reading it borrows a copy.
            vars(tokenizer)[_EOS_ID_ATTRIBUTE] = tokenizer.eos_token_id
        return make_pool(tokenizer, 0)

    hf_renderer.maybe_make_thread_pool = copies_on_demand


def _copies_on_demand_check() -> str | None:
    return callable_with(
        _renderer_module(), "maybe_make_thread_pool", ("tokenizer", "copies")
    ) or callable_with(_renderer_base_module().BaseRenderer, "get_eos_token_id", ("self",))


def _eos_token_id_kept() -> None:
    renderer = _renderer_base_module().BaseRenderer
    look_up = renderer.get_eos_token_id

    def get_eos_token_id(self: Any) -> int | None:
        kept = getattr(self.tokenizer, "__dict__", {})
        if _EOS_ID_ATTRIBUTE in kept:
            eos: int | None = kept[_EOS_ID_ATTRIBUTE]
            return eos
        return look_up(self)  # type: ignore[no-any-return]

    renderer.get_eos_token_id = get_eos_token_id


def _install_copies_on_demand() -> None:
    _copies_on_demand()
    _eos_token_id_kept()


# The renderer makes its tokenizer thread-safe by routing calls through a pool of deep
# copies, renderer_num_workers + 1 of them (at least two), ~0.15 s each for a 49k-token
# vocabulary, made at engine init. In ebb's runner every request borrowed from the pool
# once, for the EOS token id that each add_request asks the tokenizer for again; that id
# is now read once, before the pool wraps the tokenizer. Of the rest of what ebb asks of
# the engine (token ids in, text out), only logprobs borrow, to decode each alternative.
# So the pool starts empty: a borrower that finds it empty gets a deep copy of its own,
# made then (the first logprobs request on a runner: ~0.15 s, once), and returns it to
# the pool; each borrower still has a copy to itself, as vLLM intends. Optional: a
# speed-up (engine init, and a pool round trip per request); vLLM's own pool is correct,
# only slower to build.
RENDERER_TOKENIZER_COPIES_ON_DEMAND = Patch(
    name="renderer-tokenizer-copies-on-demand",
    required=False,
    check=_copies_on_demand_check,
    install=_install_copies_on_demand,
    without="the renderer deep-copies its tokenizer at engine init (~0.15 s per copy)",
)


def _worker_utils_module() -> Any:
    import vllm.v1.worker.utils as worker_utils

    return worker_utils


# What a cache of fresh pages is worth making lazily: below this, torch.zeros is as fast.
_ON_DEMAND_MIN_BYTES = 64 << 20


class _TorchZerosOnDemand:
    """torch, except that a large one-dimensional CPU `torch.zeros` is anonymous memory.

    The kernel hands out anonymous pages zero-filled on their first touch, so the tensor
    holds zeros, as torch.zeros would, without writing them all first."""

    def __init__(self, torch: Any):
        self._torch = torch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def zeros(self, *size: Any, dtype: Any = None, device: Any = None, **kwargs: Any) -> Any:
        torch = self._torch
        if kwargs or len(size) != 1 or not isinstance(size[0], int):
            return torch.zeros(*size, dtype=dtype, device=device, **kwargs)
        dtype = dtype or torch.get_default_dtype()
        nbytes = size[0] * dtype.itemsize
        if torch.device(device or "cpu").type != "cpu" or nbytes < _ON_DEMAND_MIN_BYTES:
            return torch.zeros(*size, dtype=dtype, device=device)
        # The tensor keeps the mapping alive; the mapping goes when the tensor does.
        return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype)


def _kv_cache_check() -> str | None:
    worker_utils = _worker_utils_module()
    problem = callable_with(
        worker_utils,
        "allocate_kv_cache",
        ("kv_cache_config", "device", "layout", "kernel_block_sizes"),
    )
    if problem is None and "zeros" not in worker_utils.allocate_kv_cache.__code__.co_names:
        problem = "allocate_kv_cache no longer makes its buffer with torch.zeros"
    return problem


def _kv_cache_on_demand() -> None:
    worker_utils = _worker_utils_module()
    worker_utils.torch = _TorchZerosOnDemand(worker_utils.torch)


# On CPU, vLLM makes the KV cache one zero-filled buffer at engine init: writing 1 GiB of
# zeros into fresh pages took ~0.37 s of a ~1.5 s pre-warmed load here, and the runner's
# memory holds the whole cache from then on. Its module's torch.zeros becomes one for
# which the kernel provides the zeros, page by page as blocks are first written: the same
# contents, faulted in by the steps that use them. The other tensors that module makes
# are small or on a GPU, and stay torch's. Optional: a speed-up (and a runner's memory
# growing with its cache's use); without it, the cache is zeroed up front.
KV_CACHE_PAGES_ON_DEMAND = Patch(
    name="kv-cache-pages-on-demand",
    required=False,
    check=_kv_cache_check,
    install=_kv_cache_on_demand,
    without="engine init writes the whole CPU KV cache's zeros up front (~0.35 s per GiB)",
)


def _embedding_module() -> Any:
    import vllm.model_executor.layers.vocab_parallel_embedding as embedding

    return embedding


def _packs_for_gemm(method: Callable[..., Any]) -> bool:
    # The method imports the packing function by name inside its body.
    code = getattr(method, "__code__", None)
    return code is not None and "dispatch_cpu_unquantized_gemm" in code.co_names


# Where ebb's process_weights_after_loading keeps vLLM's: the check inspects vLLM's code,
# and an install in a process that already has ebb's wraps vLLM's, not ebb's.
_PACKS_NOW = "_ebb_packs_now"


def _vllm_weight_processing(method: Any) -> Callable[..., Any]:
    """vLLM's own process_weights_after_loading, whether or not ebb's stands in for it."""
    current: Callable[..., Any] = method.process_weights_after_loading
    vllms: Callable[..., Any] = getattr(current, _PACKS_NOW, current)
    return vllms


def _embedding_packing_check() -> str | None:
    embedding = _embedding_module()
    method = embedding.UnquantizedEmbeddingMethod
    problem = callable_with(method, "process_weights_after_loading", ("self", "layer"))
    if problem is None and not _packs_for_gemm(_vllm_weight_processing(method)):
        problem = "its process_weights_after_loading no longer packs the table for a GEMM"
    if problem is None and not isinstance(getattr(embedding, "ParallelLMHead", None), type):
        problem = "vocab_parallel_embedding.ParallelLMHead is missing"
    return problem


def _pack_lookup_tables_on_first_gemm() -> None:
    embedding = _embedding_module()
    method = embedding.UnquantizedEmbeddingMethod
    pack_now = _vllm_weight_processing(method)

    def process_weights_after_loading(self: Any, layer: Any) -> None:
        if isinstance(layer, embedding.ParallelLMHead):
            pack_now(self, layer)  # the logits' GEMM: every step uses it
            return

        def pack_on_first_gemm(x: Any, weight: Any, bias: Any) -> Any:
            pack_now(self, layer)  # replaces layer.cpu_linear with the packed GEMM
            if layer.cpu_linear is pack_on_first_gemm:
                raise RuntimeError("vLLM did not install a CPU GEMM for an embedding table")
            return layer.cpu_linear(x, weight, bias)

        layer.cpu_linear = pack_on_first_gemm

    setattr(process_weights_after_loading, _PACKS_NOW, pack_now)
    method.process_weights_after_loading = process_weights_after_loading


# On CPU, vLLM packs every embedding table into a oneDNN GEMM handle after loading, the
# input embedding included, and keeps the table as well. The input embedding is only ever
# looked up row by row (`embedding()`), so its packed copy (vocabulary x hidden size, in
# the weights' dtype) is memory and load time spent for nothing, tied LM head or not: for
# the default model 108 MB of a runner's memory and 30-150 ms of a pre-warmed load. The
# LM head (`ParallelLMHead`, tied or not) is packed at load as before; any other table is
# packed when a model first multiplies by it (some models use their input embedding as
# the LM head), so that first GEMM pays what the load no longer does. Optional: memory and
# a speed-up; without it, every table is packed at load.
EMBEDDING_PACKED_ON_FIRST_GEMM = Patch(
    name="embedding-packed-on-first-gemm",
    required=False,
    check=_embedding_packing_check,
    install=_pack_lookup_tables_on_first_gemm,
    without="every CPU embedding table is packed for a GEMM at load, used or not",
)


def _sampler_module() -> Any:
    import vllm.v1.sample.sampler as sampler

    return sampler


def _count_at_least(x: Any, values: Any) -> Any:
    # vLLM's compiled batched_count_greater_than, eagerly: each row's count of entries at
    # least its value (a sampled token's rank among the logprobs).
    return (x >= values).sum(-1)


def _logprob_ranks_check() -> str | None:
    sampler = _sampler_module()
    if sampler.batched_count_greater_than is _count_at_least:
        return None  # ours already: an engine preloaded earlier in this same process
    problem = callable_with(sampler, "batched_count_greater_than", ("x", "values"))
    compiled = hasattr(sampler.batched_count_greater_than, "_torchdynamo_orig_callable")
    if problem is None and not compiled:
        problem = "sampler.batched_count_greater_than is no longer a torch.compile'd function"
    return problem


def _logprob_ranks_eager() -> None:
    _sampler_module().batched_count_greater_than = _count_at_least


# The sampler ranks each sampled token among the logprobs with a torch.compile'd function
# (`batched_count_greater_than`), compiled by Inductor on the first request that asks for
# logprobs: that request waited ~4 s (2 cores) for its first token against ~0.2 s for the
# next. On CPU the eager comparison costs a (batch x vocab) bool tensor, a few MB, and
# nothing to compile; warming the compiled one at load would move the 4 s into every cold
# start. Optional: without it, a runner's first logprobs request pays the compile.
LOGPROB_RANKS_EAGER = Patch(
    name="logprob-ranks-eager",
    required=False,
    check=_logprob_ranks_check,
    install=_logprob_ranks_eager,
    without="a runner's first request with logprobs waits for Inductor to compile (~4 s)",
)


def apply_preload(*, cuda: bool) -> None:
    """Patch vLLM once its modules are imported (by the caller), while a stem waits.

    Raises `VllmPatchError` when a required patch cannot apply.
    """
    if not cuda:
        # Triton runs natively on GPUs: the stand-ins are a CPU platform matter.
        apply(KERNEL_OVERRIDES_ONCE)
        apply(KV_CACHE_PAGES_ON_DEMAND)
        # Only vLLM's CPU platform packs embedding tables for a GEMM.
        apply(EMBEDDING_PACKED_ON_FIRST_GEMM)
        # On a GPU the compiled kernel spares a (batch x vocab) copy of the logprobs.
        apply(LOGPROB_RANKS_EAGER)
    apply(LOGGING_CONFIGURED_EARLY)
    apply(RENDERER_TOKENIZER_COPIES_ON_DEMAND)
