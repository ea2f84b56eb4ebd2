"""Loading a runner's engine: the engine libraries a stem imports before it knows its
model, the weights in the local cache, the options the engine is built with, and the
engine itself."""

from __future__ import annotations

from pathlib import Path

from ebb.config import Settings
from ebb.engine_options import lora_limits
from ebb.engines import EngineRegistry
from ebb.launching.tiers import Tier
from ebb.queue.gpu_records import GpuPlacement
from ebb.queue.priority import engine_batch_limit
from ebb.queue.schema import DeploymentSpec
from ebb.runners.cold_start_clock import ColdStartClock
from ebb.runners.embedding_inputs import EmbeddingInputs
from ebb.runners.engine import EngineAdapter, EngineOptions


def import_engine_libraries() -> None:
    from ebb.runners import engine_vllm

    engine_vllm.preload()
    # What the load imports besides the engine: the weight cache (~30 ms).
    import ebb.weights_cache  # noqa: F401


def engine_options(
    settings: Settings,
    spec: DeploymentSpec,
    model_path: Path | None,
    model_len: int,
    placement: GpuPlacement | None,
) -> EngineOptions:
    """What the engine is built with: the deployment's options and its placement's share."""
    engine = spec.engine
    return EngineOptions(
        model_path=model_path,
        max_model_len=spec.max_model_len or model_len,
        # Room for the critical requests a full runner still takes (ebb.queue.priority).
        max_num_seqs=engine_batch_limit(spec.max_concurrency, engine.max_num_seqs),
        kv_cache_gib=settings.kv_cache_gib,
        source=spec.source,
        dtype=engine.dtype,
        quantization=engine.quantization,
        # Placement's split on a host it placed; else (a pod or an actor given its GPUs
        # by the cluster) the deployment's own.
        tensor_parallel_size=(
            placement.tensor_parallel_size if placement else engine.tensor_parallel_size or 1
        ),
        enable_prefix_caching=engine.enable_prefix_caching,
        enforce_eager=engine.enforce_eager,
        gpu_memory_utilization=placement.gpu_memory_utilization if placement else None,
        task=spec.serving.task,
        lora=lora_limits(engine),
    )


def load_engine(
    settings: Settings,
    spec: DeploymentSpec,
    clock: ColdStartClock,
    tier: Tier,
    placement: GpuPlacement | None = None,
) -> tuple[EngineAdapter, Tier]:
    entry = EngineRegistry.from_settings(settings).entry_for(spec.source)
    if entry.preload_engine():
        clock.lap("import")
    if entry.prepares_weights:
        model_path, model_len, tier = _prepare_weights(settings, spec.source, tier)
    else:
        model_path, model_len = None, entry.context_len_of(spec.source)
    clock.lap("weights")
    options = engine_options(settings, spec, model_path, model_len, placement)
    engine: EngineAdapter = entry.load_engine(options)
    if spec.serving.task == "embed":
        engine = EmbeddingInputs(engine)  # jobs' multi-input embedding work items
    return engine, tier


def _prepare_weights(settings: Settings, source: str, tier: Tier) -> tuple[Path, int, Tier]:
    """The source's weights in the local cache: (path, context length, tier after fetching)."""
    from ebb.weights_cache import CacheOptions, ensure

    phases: set[str] = set()
    # Held until this process exits: a model a live runner serves is never evicted.
    model = ensure(
        source,
        settings.weights_dir,
        progress=lambda phase, _: phases.add(phase),
        options=CacheOptions.from_settings(settings),
        hold=True,
    )
    if phases & {"download", "convert"}:
        tier = tier.after_weights_fetch()
    return model.path, model.max_model_len, tier
