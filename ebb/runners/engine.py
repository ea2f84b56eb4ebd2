"""The seam between a runner and the inference engine it drives.

`EngineAdapter` is what the runner loop calls; `engine_vllm.VllmEngine` wraps vLLM, and
in tests `ebb.testing.fake_engine.FakeEngine` stands in for it. Which one a deployment
gets is the engine registry's answer (`ebb.engines`). Only `engine_vllm.py` and the
`engine_patches*.py` modules (every patch ebb applies to vLLM) import vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ebb.engine_options import LoraLimits
from ebb.queue.schema import ChoiceDelta, SamplingSpec


class EngineRequestError(ValueError):
    """The engine refused a request (bad parameters it alone could detect); `code` is the
    request's failure code (ebb.errors')."""

    code = "invalid_request"


@dataclass(frozen=True)
class StepOutput:
    """What one engine step produced for one request.

    `choices` holds only choices with new output in this step. `finished` is True exactly
    once per request, on its last output; token counts are the engine's own running totals.
    """

    request_id: str
    choices: list[ChoiceDelta]
    finished: bool
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class EngineStats:
    """The engine's own figures, for metrics. Token counts are totals since it loaded."""

    kv_cache_usage_ratio: float | None  # share of KV-cache blocks in use; None: unknown
    prefix_cache_queried_tokens: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hit_tokens: int  # of those, tokens found cached (prefill skipped)


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter a request runs with: `name` and `int_id` identify it to the engine
    (one id per adapter for the engine's life), `path` is its verified local copy."""

    name: str
    int_id: int
    path: Path


@dataclass(frozen=True)
class EngineOptions:
    """What one engine build gets: the deployment's engine options (`EngineSpec`, None
    where it leaves the engine's own choice) and, on a GPU, its placement's share."""

    model_path: Path | None
    max_model_len: int
    max_num_seqs: int = 32
    kv_cache_gib: int = 1
    seed: int = 0
    # The deployment's source, for engines that serve it without prepared weights.
    source: str = ""
    dtype: str | None = None
    quantization: str | None = None
    tensor_parallel_size: int = 1
    enable_prefix_caching: bool | None = None
    enforce_eager: bool | None = None
    # The share of each device's memory the engine may use (its placement's); None on CPU.
    gpu_memory_utilization: float | None = None
    # "embed": run the model as a pooling model (requests with SamplingSpec.embed only).
    task: str = "generate"
    # LoRA on (requests may name a `LoraAdapter`), with these limits; None: off.
    lora: LoraLimits | None = None


def tenant_cache_salt(tenant: str) -> str:
    """The prefix-cache salt of `tenant`'s requests: one namespace per tenant, so a cached
    prefix is found only by the tenant whose prompt put it there (its first token's
    timing would otherwise tell another tenant what was asked)."""
    return f"tenant:{tenant}"


class EngineAdapter(Protocol):
    """A continuous-batching engine driven by one thread.

    Contract: every method is called from the runner's loop thread only. `add_request`
    returns at once (the request joins the running batch on the next `step`); `step` runs
    one scheduling iteration and returns the outputs it produced, possibly none; `abort`
    frees a request's resources (KV cache) and produces no further output for it.
    """

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingSpec,
        continued: int = 0,
        priority: int = 1,
        lora: LoraAdapter | None = None,
        cache_salt: str = "",
    ) -> None:
        """`continued`: the last tokens of the prompt are this many of the request's own
        output so far (a continuation, see ebb.queue.continuation); its output goes on
        after them, and `sampling` counts only what is left to generate. `priority`: its
        class's rank (ebb.queue.priority.rank, 0 most urgent), for an engine whose
        scheduler orders by it; others may ignore it. `lora`: run it with that adapter
        (loaded on first use, kept LRU by the engine); an engine built without LoRA
        refuses it (EngineRequestError). `cache_salt`: its prefix-cache namespace (its
        tenant's, `tenant_cache_salt`): a prompt finds cached blocks only of prompts
        with the same salt, so no tenant can time another's prompts ("": unsalted)."""
        ...

    def abort(self, request_ids: Iterable[str]) -> None: ...

    def step(self) -> list[StepOutput]: ...

    def has_unfinished(self) -> bool: ...

    def shutdown(self) -> None: ...

    def stats(self) -> EngineStats:
        """Current figures; cheap enough to call once a second between steps."""
        ...

    # Sleep mode (vLLM level 1: weights offloaded, KV cache dropped, the process and its
    # CUDA context kept) makes a recently idle runner the fastest cold-start tier. Only
    # engines that report `supports_sleep` are ever put to sleep; on CPU it is a no-op in
    # vLLM, so the vLLM adapter reports False there.
    @property
    def supports_sleep(self) -> bool: ...

    # The CPU threads the engine computes on while it serves: torch's thread count on a
    # CPU host; 0 where it computes elsewhere (a GPU) or not at all (a fake engine). With
    # one, the runner gives that thread a core of its own (`core_pinning`).
    @property
    def cpu_threads(self) -> int: ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...
