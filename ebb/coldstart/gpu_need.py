"""How much GPU memory one runner of a deployment needs, before it starts.

need = weights + KV-cache budget + activation/graph reserve, where
- weights: the safetensors files of the model's entry in the weight cache (its manifest);
- KV cache: enough for `max_num_seqs` sequences of `KV_TOKENS_PER_SEQUENCE` tokens, and
  at least one sequence of the full context (vLLM refuses to start without that), at the
  bytes per token the model's config implies (2 × layers × KV heads × head size × dtype);
- reserve: the CUDA context and activations, plus CUDA graphs unless the engine is eager.
A deployment's `engine.gpu_memory_gib` replaces the estimate; an engine entry without
prepared weights (the fake test engine) states its own need.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebb.coldstart.placement import GIB, GpuNeed
from ebb.config import Settings
from ebb.engines import EngineRegistry
from ebb.queue.schema import DeploymentSpec
from ebb.weights_cache import cached_manifest
from ebb.weights_cache.manifest import Manifest, max_model_len, read_config

log = logging.getLogger(__name__)

KV_TOKENS_PER_SEQUENCE = 2048
CONTEXT_RESERVE_BYTES = GIB  # CUDA context, allocator slack, activations of one step
GRAPH_RESERVE_BYTES = GIB // 2  # captured CUDA graphs (none when eager)
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache's size depends on, read from config.json."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    context_len: int

    @classmethod
    def from_config(cls, config: dict[str, Any], context_len: int) -> ModelShape:
        scope = config.get("text_config") or config
        heads = int(scope.get("num_attention_heads") or 1)
        hidden = int(scope.get("hidden_size") or 0)
        return cls(
            layers=int(scope.get("num_hidden_layers") or 0),
            kv_heads=int(scope.get("num_key_value_heads") or heads),
            head_dim=int(scope.get("head_dim") or (hidden // heads)),
            dtype_bytes=_DTYPE_BYTES.get(str(config.get("torch_dtype")), 2),
            context_len=context_len,
        )

    def kv_bytes_per_token(self, dtype: str | None) -> int:
        width = _DTYPE_BYTES.get(dtype or "", self.dtype_bytes)
        return 2 * self.layers * self.kv_heads * self.head_dim * width


def weights_bytes(manifest: Manifest) -> int:
    """The bytes vLLM loads: the safetensors shards (not tokenizer or config files)."""
    return sum(f.size_bytes for f in manifest.files if f.path.endswith(".safetensors"))


def need_from(
    manifest: Manifest, shape: ModelShape, spec: DeploymentSpec, *, model_key: str
) -> GpuNeed:
    """The estimate for one runner of `spec` serving the model `manifest` describes."""
    engine = spec.engine
    context = min(spec.max_model_len or shape.context_len, shape.context_len)
    seqs = engine.max_num_seqs or spec.max_concurrency
    tokens = max(context, seqs * min(KV_TOKENS_PER_SEQUENCE, context))
    weights = weights_bytes(manifest)
    reserve = CONTEXT_RESERVE_BYTES + (0 if engine.enforce_eager else GRAPH_RESERVE_BYTES)
    return GpuNeed(
        weights_bytes=weights,
        kv_cache_bytes=tokens * shape.kv_bytes_per_token(engine.dtype),
        reserve_bytes=reserve,
        model_key=model_key,
        host_ram_asleep_bytes=weights,
    )


def explicit_need(gib: float, model_key: str) -> GpuNeed:
    budget = math.ceil(gib * GIB)
    return GpuNeed(weights_bytes=budget, kv_cache_bytes=0, reserve_bytes=0, model_key=model_key)


def estimate_need(
    settings: Settings, engines: EngineRegistry, spec: DeploymentSpec
) -> GpuNeed | None:
    """The need of one runner of `spec`; None while its weights are not in the cache yet
    (then nothing can be said about it and no runner is placed)."""
    if spec.engine.gpu_memory_gib is not None:
        return explicit_need(spec.engine.gpu_memory_gib, spec.source)
    entry = engines.entry_for(spec.source)
    stated = entry.memory_need_of(spec.source)
    if stated is not None:
        return GpuNeed(
            weights_bytes=stated,
            kv_cache_bytes=0,
            reserve_bytes=0,
            model_key=spec.source,
            host_ram_asleep_bytes=stated,
        )
    found = cached_manifest(spec.source, settings.weights_dir)
    if found is None:
        return None
    manifest, root = found
    return need_from(manifest, _shape(root), spec, model_key=manifest.key)


def _shape(root: Path) -> ModelShape:
    config = read_config(root)
    return ModelShape.from_config(config, max_model_len(config, root))
