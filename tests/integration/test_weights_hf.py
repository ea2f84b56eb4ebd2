"""hf:// sources through the real huggingface_hub client against a local Hub endpoint
(tests/support/hub_server.py says why an endpoint rather than a prepared directory):
revision resolution, allow-patterns, HF_TOKEN, error codes, retries, offline fallback.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from support import free_port
from support.hub_server import HubServer
from support.weights import leftovers, published

from ebb.errors import WeightsAuthError, WeightsNotFound
from ebb.weights_cache import CacheOptions, ensure, verify

pytestmark = pytest.mark.integration

TOKEN = "hf_test_token"
OPTIONS = CacheOptions(concurrency=2, attempts=3, backoff_s=0.05)
SERVED = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def write_repo(folder: Path, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    weights = {"model.norm.weight": rng.standard_normal(512 * 1024).astype(np.float32)}
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    (folder / "tokenizer.json").write_text(json.dumps({"seed": seed}))
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"\0" * 4096)  # never fetched
    (folder / "README.md").write_text("# tiny")  # never fetched
    return folder


@pytest.fixture
def hub(tmp_path, monkeypatch):
    server = HubServer(token=TOKEN)
    server.add("org/tiny", write_repo(tmp_path / "repo"))
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    yield server
    server.stop()


def downloads(hub: HubServer) -> list[str]:
    return sorted(
        path.rsplit("/", 1)[-1]
        for method, path, _ in hub.requests
        if method == "GET" and "/resolve/" in path
    )


def test_repo_is_fetched_with_the_token_and_only_what_serving_needs(hub, tmp_path):
    phases = []
    model = ensure(
        "hf://org/tiny", tmp_path / "cache", lambda p, f: phases.append(p), options=OPTIONS
    )

    repo = hub.repos["org/tiny"].folder
    assert sorted(p.name for p in model.path.iterdir() if p.name in SERVED) == SERVED
    for name in SERVED:
        assert (model.path / name).read_bytes() == (repo / name).read_bytes()
    assert not (model.path / "pytorch_model.bin").exists()
    assert not (model.path / ".cache").exists()  # the client's bookkeeping is not published
    assert downloads(hub) == SERVED
    assert {auth for _, path, auth in hub.requests if path.startswith(("/api/models", "/org"))} == {
        f"Bearer {TOKEN}"
    }
    assert "download" in phases
    assert model.max_model_len == 64
    verify(model, full=True)


def test_cached_branch_is_resolved_but_not_downloaded_again(hub, tmp_path):
    first = ensure("hf://org/tiny@main", tmp_path / "cache", options=OPTIONS)
    hub.requests.clear()

    again = ensure("hf://org/tiny@main", tmp_path / "cache", options=OPTIONS)

    assert again == first
    assert downloads(hub) == []
    assert [path for _, path, _ in hub.requests if "/revision/" in path] == [
        "/api/models/org/tiny/revision/main"
    ]


def test_cached_commit_needs_no_network_at_all(hub, tmp_path):
    commit = hub.repos["org/tiny"].commit
    first = ensure(f"hf://org/tiny@{commit}", tmp_path / "cache", options=OPTIONS)
    hub.stop()

    assert ensure(f"hf://org/tiny@{commit}", tmp_path / "cache", options=OPTIONS) == first


def test_a_moved_branch_gets_a_new_entry(hub, tmp_path):
    first = ensure("hf://org/tiny", tmp_path / "cache", options=OPTIONS)
    hub.add("org/tiny", write_repo(tmp_path / "repo2", seed=1))

    second = ensure("hf://org/tiny", tmp_path / "cache", options=OPTIONS)

    assert second.path != first.path
    assert json.loads((second.path / "tokenizer.json").read_text()) == {"seed": 1}
    verify(first, full=True)


def test_unreachable_hub_serves_the_cached_version(hub, tmp_path, monkeypatch):
    model = ensure("hf://org/tiny", tmp_path / "cache", options=OPTIONS)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")

    assert ensure("hf://org/tiny", tmp_path / "cache", options=OPTIONS) == model


def test_server_errors_on_downloads_are_retried(hub, tmp_path):
    hub.fail_downloads = 2
    model = ensure("hf://org/tiny", tmp_path / "cache", options=OPTIONS)
    assert hub.fail_downloads == 0
    verify(model, full=True)


def test_runner_offline_flag_does_not_block_an_explicit_fetch(hub, tmp_path, monkeypatch):
    import huggingface_hub.constants as hub_constants

    # What a runner's engine preload sets for vLLM's own lookups.
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)

    model = ensure("hf://org/tiny", tmp_path / "cache", options=OPTIONS)

    assert downloads(hub) == SERVED
    assert hub_constants.HF_HUB_OFFLINE is True  # restored for vLLM
    verify(model, full=True)


def test_wrong_token_is_an_auth_error(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(WeightsAuthError, match="HF_TOKEN"):
        ensure("hf://org/tiny", tmp_path / "cache", options=OPTIONS)
    assert published(tmp_path / "cache") == [] and leftovers(tmp_path / "cache") == []


def test_gated_repo_is_an_auth_error(hub, tmp_path):
    hub.add("org/gated", hub.repos["org/tiny"].folder, gated=True)
    with pytest.raises(WeightsAuthError, match="gated"):
        ensure("hf://org/gated", tmp_path / "cache", options=OPTIONS)


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("hf://org/absent", "no such repository"),
        ("hf://org/tiny@no-such-branch", "no such branch, tag or commit"),
    ],
)
def test_missing_repo_or_revision_is_not_found(hub, tmp_path, source, says):
    with pytest.raises(WeightsNotFound, match=says):
        ensure(source, tmp_path / "cache", options=OPTIONS)


def test_repo_without_safetensors_is_not_found(hub, tmp_path):
    folder = write_repo(tmp_path / "bin-only")
    (folder / "model.safetensors").unlink()
    hub.add("org/bin-only", folder)
    with pytest.raises(WeightsNotFound, match=r"config.json and \*.safetensors"):
        ensure("hf://org/bin-only", tmp_path / "cache", options=OPTIONS)
