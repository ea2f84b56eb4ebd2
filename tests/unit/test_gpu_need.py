"""A runner's GPU memory need, estimated before it starts: weights from the weight cache's
manifest, a KV-cache budget from the model's config, a reserve; or what the deployment or
its engine entry states."""

from __future__ import annotations

import json
from pathlib import Path

from ebb.coldstart.gpu_need import (
    CONTEXT_RESERVE_BYTES,
    GRAPH_RESERVE_BYTES,
    KV_TOKENS_PER_SEQUENCE,
    ModelShape,
    estimate_need,
    need_from,
    weights_bytes,
)
from ebb.coldstart.placement import GIB
from ebb.config import Settings
from ebb.engines import EngineRegistry
from ebb.queue.schema import DeploymentSpec, EngineSpec
from ebb.weights_cache.manifest import FileEntry, Manifest

# SmolLM2-135M's shape: 30 layers, 3 KV heads of 64, bf16, 8192 tokens of context.
CONFIG = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 8192,
}
SHAPE = ModelShape.from_config(CONFIG, 8192)
MANIFEST = Manifest(
    source="/m",
    key="k1",
    files=(
        FileEntry("model.safetensors", 270_000_000, "a"),
        FileEntry("tokenizer.json", 2_000_000, "b"),
        FileEntry("config.json", 1_000, "c"),
    ),
    created_at="2026-01-01T00:00:00Z",
)


def spec(**engine: object) -> DeploymentSpec:
    return DeploymentSpec(name="d", source="/m", max_concurrency=32, engine=EngineSpec(**engine))


def test_weights_are_the_safetensors_shards_only() -> None:
    assert weights_bytes(MANIFEST) == 270_000_000


def test_kv_bytes_per_token_follow_the_config() -> None:
    assert SHAPE.head_dim == 64  # hidden_size / attention heads
    assert SHAPE.kv_bytes_per_token(None) == 2 * 30 * 3 * 64 * 2
    assert SHAPE.kv_bytes_per_token("float32") == 2 * 30 * 3 * 64 * 4


def test_need_is_weights_plus_kv_plus_reserve() -> None:
    need = need_from(MANIFEST, SHAPE, spec(), model_key="k1")
    assert need.weights_bytes == 270_000_000
    assert need.kv_cache_bytes == 32 * KV_TOKENS_PER_SEQUENCE * SHAPE.kv_bytes_per_token(None)
    assert need.reserve_bytes == CONTEXT_RESERVE_BYTES + GRAPH_RESERVE_BYTES
    assert need.host_ram_asleep_bytes == 270_000_000
    assert need.model_key == "k1"


def test_eager_engines_reserve_no_cuda_graphs() -> None:
    need = need_from(MANIFEST, SHAPE, spec(enforce_eager=True), model_key="k1")
    assert need.reserve_bytes == CONTEXT_RESERVE_BYTES


def test_kv_budget_holds_at_least_one_full_context() -> None:
    one = need_from(MANIFEST, SHAPE, spec(max_num_seqs=1), model_key="k1")
    assert one.kv_cache_bytes == 8192 * SHAPE.kv_bytes_per_token(None)
    short = DeploymentSpec(name="d", source="/m", max_concurrency=4, max_model_len=512)
    assert need_from(MANIFEST, SHAPE, short, model_key="k1").kv_cache_bytes == (
        4 * 512 * SHAPE.kv_bytes_per_token(None)
    )


def test_an_explicit_budget_replaces_the_estimate(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    need = estimate_need(settings, EngineRegistry(), spec(gpu_memory_gib=7.5))
    assert need is not None and need.total_bytes == int(7.5 * GIB)


def test_the_fake_engine_states_its_own_need(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, test_engines=True)
    fake = DeploymentSpec(name="f", source="fake://f?gpu_gib=3")
    need = estimate_need(settings, EngineRegistry.from_settings(settings), fake)
    assert need is not None and need.total_bytes == 3 * GIB


def test_estimated_from_the_cached_manifest(tmp_path: Path) -> None:
    from ebb.weights_cache import ensure

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    settings = Settings(home=tmp_path / "home")
    local = DeploymentSpec(name="l", source=str(model), max_concurrency=2)
    assert estimate_need(settings, EngineRegistry(), local) is None  # not cached yet
    ensure(str(model), settings.weights_dir)
    need = estimate_need(settings, EngineRegistry(), local)
    assert need is not None
    assert need.weights_bytes == 4096
    # Two sequences of 2,048 tokens are less than one full context of 8,192.
    assert need.kv_cache_bytes == 8192 * SHAPE.kv_bytes_per_token(None)
