"""vLLM behind the `EngineAdapter` seam: the synchronous, in-process `LLMEngine`.

`preload()` sets the environment vLLM reads, pays for its imports and applies ebb's patches
to vLLM (all of them in the `engine_patches*` modules), so that a pre-warmed stem process can
do this before it knows its model; `VllmEngine.load()` then builds the engine for one local
HF-layout checkpoint. vLLM is imported only inside functions, after `preload()` has set the
environment, because some of its settings are read at import.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ebb.gpus.count import visible_gpu_count
from ebb.queue.schema import ChoiceDelta, FinishReason, SamplingSpec, TokenLogprob, TopLogprob
from ebb.runners import engine_patches, engine_patches_load, engine_patches_preload
from ebb.runners.core_pinning import usable_core_count
from ebb.runners.engine import (
    EngineOptions,
    EngineRequestError,
    EngineStats,
    LoraAdapter,
    StepOutput,
)

if TYPE_CHECKING:
    from vllm import PoolingParams, SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.logprobs import Logprob
    from vllm.lora.request import LoRARequest
    from vllm.outputs import CompletionOutput, PoolingRequestOutput, RequestOutput
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

# A step that produces nothing has (nearly always) run nothing: its requests wait on a
# structured-output grammar that vLLM compiles in a worker thread. A caller looping on step()
# would spin a core, and the GIL, against that thread; a short pause lets it finish sooner.
_EMPTY_STEP_PAUSE_S = 0.001

_preloaded = False


@contextmanager
def _phase(name: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    logger.info("engine: %s took %.2f s", name, time.perf_counter() - started)


@contextmanager
def _every_core_while_loading(cuda: bool) -> Iterator[None]:
    """On CPU, torch's compute threads on every core while the engine is built, then back
    to what it had (`engine_patches.OMP_THREADS`: one core left free while serving). The
    load's weight copies and oneDNN weight packing are parallel ops: on 2 cores, 0.93 s ->
    0.75 s to a built engine, the time a waiting request waits, while the serving-time
    contention that count guards against has not begun. An operator's own OMP_NUM_THREADS
    (several runners sharing a host's cores, say) holds while loading too."""
    if cuda or not engine_patches.thread_count_is_ours():
        yield
        return
    import torch

    # vLLM's CPU worker replaces torch.set_num_threads with a warning at engine init (it
    # binds threads itself in its multiprocess executor); torch._C's is the function.
    set_num_threads = torch._C.set_num_threads
    serving = torch.get_num_threads()
    set_num_threads(max(serving, usable_core_count()))
    try:
        yield
    finally:
        set_num_threads(serving)


def _has_cuda() -> bool:
    # NVML, never torch.cuda: a stem or the fork server calls this before it forks, and
    # a CUDA context does not survive a fork (see `devices`).
    return visible_gpu_count() > 0


def preload() -> None:
    """Set vLLM's environment, import its heavy modules and patch it; idempotent.

    Raises `engine_patches.VllmPatchError` when a required patch cannot apply.
    """
    global _preloaded
    if _preloaded:
        return
    engine_patches.set_process_env()
    with _phase("preload (vllm imports)"):
        import vllm.engine.arg_utils
        import vllm.inputs
        import vllm.sampling_params
        import vllm.v1.engine.llm_engine  # noqa: F401

        # The worker module is otherwise imported during engine init (~0.7 s on CPU).
        cuda = _has_cuda()
        if cuda:
            import vllm.v1.worker.gpu_worker  # noqa: F401
        else:
            import vllm.v1.worker.cpu_worker  # noqa: F401
        # Every model load asks whether online quantization is configured, which imports
        # compressed_tensors (~40 ms on CPU). A later vLLM may have moved it: then the
        # load imports whatever it needs itself.
        with contextlib.suppress(ImportError):
            import vllm.model_executor.layers.quantization.online.base  # noqa: F401
        engine_patches_preload.apply_preload(cuda=cuda)
        # Engine init ends with full GC passes over every object (vLLM's freeze_gc_heap);
        # the millions that torch and vLLM created at import live forever anyway. Freezing
        # them now, while a stem waits, takes them out of every later collection (~0.4 s
        # off the load that a waiting request pays for).
        gc.collect()
        gc.freeze()
    _preloaded = True


def _lora_request(lora: LoraAdapter | None) -> LoRARequest | None:
    """vLLM's handle on an adapter: by its id vLLM keeps it loaded (LRU, max_cpu_loras)."""
    if lora is None:
        return None
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora.name, lora.int_id, str(lora.path))


def _engine_args(options: EngineOptions, cuda: bool) -> EngineArgs:
    from vllm.engine.arg_utils import EngineArgs

    if options.model_path is None:
        raise ValueError("VllmEngine needs a local model directory (options.model_path)")
    # Only what the deployment set reaches vLLM; the rest keeps vLLM's defaults.
    chosen: dict[str, Any] = {}
    if options.quantization is not None:
        chosen["quantization"] = options.quantization
    if options.enable_prefix_caching is not None:
        chosen["enable_prefix_caching"] = options.enable_prefix_caching
    if cuda and options.gpu_memory_utilization is not None:
        # The placement's share: a second runner on the device must pass vLLM's check.
        chosen["gpu_memory_utilization"] = options.gpu_memory_utilization
    if options.lora is not None:
        chosen |= {
            "enable_lora": True,
            "max_loras": options.lora.max_loras,
            "max_lora_rank": options.lora.max_lora_rank,
            "max_cpu_loras": options.lora.max_cpu_loras,
        }
    if options.task == "embed":
        # An embedding deployment: vLLM's pooling runner, converting a generative
        # checkpoint into an embedding model (last-token pooling, normalized) if need be.
        chosen.update(runner="pooling", convert="embed")
    dtype = options.dtype or "auto"
    if not cuda and dtype == "auto":
        dtype = engine_patches.CPU_DTYPE
    return EngineArgs(
        model=str(options.model_path),
        max_model_len=options.max_model_len,
        max_num_seqs=options.max_num_seqs,
        seed=options.seed,
        # torch.compile on CPU: slower start and wrong answers here; eager is correct.
        enforce_eager=True if not cuda else bool(options.enforce_eager),
        dtype=dtype,
        tensor_parallel_size=options.tensor_parallel_size,
        # The runner keeps its own metrics; vLLM's periodic stat logging is per-step work.
        disable_log_stats=True,
        # Critical requests first in the engine's waiting queue, and the last preempted
        # when KV blocks run out (each request's class rank: ebb.queue.priority).
        scheduling_policy="priority",
        # Sleep mode is a GPU feature (a no-op on CPU): it enables the sleeping tier.
        enable_sleep_mode=cuda,
        **chosen,
    )


def _structured_outputs(spec: SamplingSpec) -> StructuredOutputsParams | None:
    from vllm.sampling_params import StructuredOutputsParams

    if spec.json_schema is not None:
        return StructuredOutputsParams(json=spec.json_schema)
    if spec.json_object:
        return StructuredOutputsParams(json_object=True)
    if spec.structural_tag is not None:
        return StructuredOutputsParams(structural_tag=spec.structural_tag)
    return None


def _sampling_params(spec: SamplingSpec) -> SamplingParams:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        n=spec.n,
        max_tokens=spec.max_tokens,
        temperature=spec.temperature,
        top_p=spec.top_p,
        stop=list(spec.stop) or None,
        seed=spec.seed,
        presence_penalty=spec.presence_penalty,
        frequency_penalty=spec.frequency_penalty,
        logprobs=spec.logprobs,
        structured_outputs=_structured_outputs(spec),
        output_kind=RequestOutputKind.DELTA,
        top_k=spec.top_k,
        min_p=spec.min_p,
        repetition_penalty=spec.repetition_penalty,
        min_tokens=spec.min_tokens,
        stop_token_ids=list(spec.stop_token_ids) or None,
        allowed_token_ids=spec.allowed_token_ids,
        ignore_eos=spec.ignore_eos,
        skip_special_tokens=spec.skip_special_tokens,
        spaces_between_special_tokens=spec.spaces_between_special_tokens,
        include_stop_str_in_output=spec.include_stop_str_in_output,
        logit_bias=dict(spec.logit_bias) or None,
    )


def _pooling_params(spec: SamplingSpec) -> PoolingParams:
    from vllm import PoolingParams

    return PoolingParams(task="embed", dimensions=spec.dimensions)


def _finish_reason(vllm_reason: str | None) -> FinishReason | None:
    if vllm_reason is None or vllm_reason in ("stop", "length"):
        return vllm_reason  # type: ignore[return-value]
    # "abort", "error" and "repetition" need features ebb does not enable (client aborts
    # never reach step(), KV connectors, repetition detection); "stop" is the closest
    # answer the schema has, and the log keeps the real one.
    logger.warning("engine: choice finished with vLLM reason %r, reported as stop", vllm_reason)
    return "stop"


def _token_logprobs(completion: CompletionOutput, top_k: int) -> list[TokenLogprob]:
    """The sampled tokens' logprobs with their top_k alternatives, most likely first.

    vLLM returns, per position, a dict {token_id: Logprob} holding the top k tokens plus
    the sampled one (which may rank below k, then it is not an alternative).
    """
    result = []
    for token_id, position in zip(completion.token_ids, completion.logprobs or [], strict=False):
        sampled = position[token_id]
        ranked = sorted(
            (lp for lp in position.values() if lp.rank is not None and lp.rank <= top_k),
            key=lambda lp: lp.rank,
        )
        top = [TopLogprob(_text(lp), lp.logprob, _utf8(lp)) for lp in ranked[:top_k]]
        result.append(TokenLogprob(_text(sampled), sampled.logprob, _utf8(sampled), top))
    return result


def _text(logprob: Logprob) -> str:
    return logprob.decoded_token or ""


def _utf8(logprob: Logprob) -> list[int]:
    return list(_text(logprob).encode("utf-8"))


@dataclass
class _Request:
    logprobs: int | None
    prompt_tokens: int = 0
    # Completion tokens per choice index, summed over the deltas seen so far.
    tokens_by_choice: dict[int, int] = field(default_factory=dict)
    # Whether its prompt's prefix-cache hits have been counted (once, on its first output).
    prefix_counted: bool = False

    def completion_tokens(self) -> int:
        return sum(self.tokens_by_choice.values())


class VllmEngine:
    def __init__(
        self,
        engine: LLMEngine,
        *,
        sleep_mode: bool = False,
        pooling: bool = False,
        on_cpu: bool = False,
    ):
        self._engine = engine
        self._on_cpu = on_cpu
        self._pooling = pooling
        self._requests: dict[str, _Request] = {}
        self._closed = False
        self._sleep_mode = sleep_mode
        self._prefix_queried_tokens = 0
        self._prefix_hit_tokens = 0

    @classmethod
    def load(cls, options: EngineOptions) -> VllmEngine:
        """Build the engine for `options.model_path`, logging each phase's duration.

        On CPU: eager mode and a KV cache of `options.kv_cache_gib`; on CUDA, vLLM's GPU
        defaults (CUDA graphs, a share of GPU memory for the KV cache).
        """
        started = time.perf_counter()
        preload()
        cuda = _has_cuda()
        # On CPU: the KV cache size vLLM reads (GiB, instead of a memory-utilization share).
        engine_patches_load.apply_before_load(
            cuda=cuda, kv_cache_gib=options.kv_cache_gib, lora=options.lora is not None
        )
        from vllm.v1.engine.llm_engine import LLMEngine

        with _phase("config"):
            config = _engine_args(options, cuda).create_engine_config()
        with (
            _phase("engine init (weights, KV cache, warmup)"),
            _every_core_while_loading(cuda),
        ):
            engine = LLMEngine.from_vllm_config(config, disable_log_stats=True)
        logger.info(
            "engine: loaded %s on %s in %.2f s",
            options.model_path,
            "cuda" if cuda else "cpu",
            time.perf_counter() - started,
        )
        return cls(engine, sleep_mode=cuda, pooling=options.task == "embed", on_cpu=not cuda)

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
        # A continuation's replayed output is prompt to vLLM: its detokenizer starts from
        # those tokens, so the first new token's text joins them as it would have.
        del continued
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt

        if request_id in self._requests:
            raise EngineRequestError(f"request {request_id} is already running")
        if sampling.embed != self._pooling:
            kind = "an embedding" if self._pooling else "a generative"
            raise EngineRequestError(f"this engine runs {kind} model; it cannot serve that")
        try:
            params = _pooling_params(sampling) if sampling.embed else _sampling_params(sampling)
            # The renderer turns token ids into the engine input (and checks their length);
            # handing add_request a raw prompt is deprecated in vLLM.
            prompt = TokensPrompt(prompt_token_ids=list(prompt_token_ids))
            if cache_salt:  # vLLM folds it into the first block's hash: a per-tenant cache
                prompt["cache_salt"] = cache_salt
            (engine_input,) = self._engine.renderer.render_cmpl([prompt])
            # vLLM's priority scheduler: lower first, ties by arrival (FCFS within a class).
            self._engine.add_request(
                request_id,
                engine_input,
                params,
                priority=priority,
                lora_request=_lora_request(lora),
            )
        except (VLLMClientError, ValueError) as error:
            raise EngineRequestError(str(error)) from error
        self._requests[request_id] = _Request(sampling.logprobs, len(prompt_token_ids))

    def abort(self, request_ids: Iterable[str]) -> None:
        known = [rid for rid in request_ids if self._requests.pop(rid, None) is not None]
        if known:
            # By the id given to add_request, vLLM aborts every child of an n>1 request.
            self._engine.abort_request(known)

    def has_unfinished(self) -> bool:
        return bool(self._engine.has_unfinished_requests())

    def step(self) -> list[StepOutput]:
        """One engine iteration, regrouped per request.

        With n > 1 vLLM runs each choice as a child request and, in DELTA mode, returns one
        RequestOutput per child that produced output, all under the parent's id and each
        holding one CompletionOutput; only the last child to finish carries finished=True.
        """
        outputs = self._engine.step()
        if not outputs:
            time.sleep(_EMPTY_STEP_PAUSE_S)
        grouped: dict[str, tuple[list[ChoiceDelta], bool]] = {}
        for output in outputs:
            request = self._requests.get(output.request_id)
            if request is None:
                continue  # aborted while this step ran
            deltas, finished = grouped.get(output.request_id, ([], False))
            if self._pooling:
                deltas.append(self._embedding(request, output))
            else:
                deltas += self._deltas(request, output)
            grouped[output.request_id] = (deltas, finished or output.finished)
        return [
            self._step_output(rid, deltas, done)
            for rid, (deltas, done) in grouped.items()
            if deltas or done
        ]

    def _embedding(self, request: _Request, output: PoolingRequestOutput) -> ChoiceDelta:
        request.prompt_tokens = len(output.prompt_token_ids or ()) or request.prompt_tokens
        vector = output.outputs.data.flatten().tolist()
        return ChoiceDelta(index=0, text="", token_count=0, finish_reason="stop", embedding=vector)

    def _deltas(self, request: _Request, output: RequestOutput) -> list[ChoiceDelta]:
        """The choices of one RequestOutput with something new; updates the token counts."""
        request.prompt_tokens = len(output.prompt_token_ids or ()) or request.prompt_tokens
        if not request.prefix_counted and output.num_cached_tokens is not None:
            request.prefix_counted = True
            self._prefix_queried_tokens += request.prompt_tokens
            self._prefix_hit_tokens += output.num_cached_tokens
        deltas = []
        for completion in output.outputs:
            new_tokens = len(completion.token_ids)
            counts = request.tokens_by_choice
            counts[completion.index] = counts.get(completion.index, 0) + new_tokens
            reason = _finish_reason(completion.finish_reason)
            if not (completion.text or new_tokens or reason):
                continue
            logprobs = None
            if request.logprobs is not None:
                logprobs = _token_logprobs(completion, request.logprobs)
            delta = ChoiceDelta(
                index=completion.index,
                text=completion.text,
                token_count=new_tokens,
                token_ids=list(completion.token_ids),
                logprobs=logprobs,
                finish_reason=reason,
            )
            deltas.append(delta)
        return deltas

    def _step_output(self, request_id: str, deltas: list[ChoiceDelta], done: bool) -> StepOutput:
        request = self._requests[request_id]
        if done:
            del self._requests[request_id]
        return StepOutput(
            request_id=request_id,
            choices=sorted(deltas, key=lambda d: d.index),
            finished=done,
            prompt_tokens=request.prompt_tokens,
            completion_tokens=request.completion_tokens(),
        )

    def stats(self) -> EngineStats:
        """Prefix-cache hits as vLLM reports them per request (`num_cached_tokens`), and
        the KV-cache usage its scheduler's block pool reports (ebb turns vLLM's own stat
        logging off, so this is read where vLLM keeps it: the in-process engine core)."""
        return EngineStats(
            kv_cache_usage_ratio=self._kv_cache_usage(),
            prefix_cache_queried_tokens=self._prefix_queried_tokens,
            prefix_cache_hit_tokens=self._prefix_hit_tokens,
        )

    def _kv_cache_usage(self) -> float | None:
        try:
            scheduler = self._engine.engine_core.engine_core.scheduler
            return float(scheduler.kv_cache_manager.usage)
        except AttributeError:  # another engine-core client or scheduler: no figure
            return None

    @property
    def supports_sleep(self) -> bool:
        return self._sleep_mode

    @property
    def cpu_threads(self) -> int:
        if not self._on_cpu:
            return 0
        import torch

        return torch.get_num_threads()

    def sleep(self) -> None:
        # Cached prefixes would point at a KV cache that level-1 sleep discards.
        self._engine.reset_prefix_cache()
        with _phase("sleep"):
            self._engine.sleep(level=1)

    def wake_up(self) -> None:
        with _phase("wake up"):
            self._engine.wake_up()

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._requests.clear()
        with _phase("shutdown"):
            self._engine.engine_core.shutdown()
