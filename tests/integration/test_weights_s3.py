"""s3:// sources against moto's S3 server (authentication on), through a TCP proxy that
counts, slows, cuts or corrupts what comes back: parallel ranged fetches, resume, integrity,
typed errors, one download for many processes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from support import free_port, wait_until
from support.weights import (
    CountingProxy,
    MotoS3,
    leftovers,
    published,
    run_in_processes,
    upload_dir,
)

from ebb.errors import WeightsAuthError, WeightsCorrupt, WeightsNotFound, WeightsTransientError
from ebb.weights_cache import CacheOptions, ensure, verify

pytestmark = pytest.mark.integration

BUCKET = "models"
MIB = 1024 * 1024
OPTIONS = CacheOptions(concurrency=4, part_bytes=2 * MIB, attempts=3, backoff_s=0.05)
SERVED = [
    "config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
]


def write_checkpoint(folder: Path, seed: int = 0, shard_mib: int = 9) -> Path:
    """A sharded HF-layout checkpoint, plus files serving does not need."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    weight_map = {}
    for i, name in enumerate(SERVED[1:3]):
        tensor = f"model.layers.{i}.weight"
        data = rng.standard_normal(shard_mib * MIB // 4).astype(np.float32)
        save_file({tensor: data}, folder / name, metadata={"format": "pt"})
        weight_map[tensor] = name
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 256}))
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "seed": seed}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    (folder / "pytorch_model.bin").write_bytes(b"\0" * MIB)  # not safetensors: never fetched
    return folder


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto with authentication on, holding s3://models/tiny (multipart uploads) and
    s3://models/sha (single-part uploads carrying a SHA-256 checksum)."""
    server = MotoS3()
    server.require_auth()
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    source = write_checkpoint(tmp_path_factory.mktemp("checkpoint") / "tiny")
    upload_dir(client, BUCKET, "tiny", source)
    for name in SERVED:
        body = (source / name).read_bytes()
        client.put_object(Bucket=BUCKET, Key=f"sha/{name}", Body=body, ChecksumAlgorithm="SHA256")
    client.put_object(Bucket=BUCKET, Key="notes/readme.md", Body=b"# not a model")
    server.source_dir = source
    yield server
    server.allow_anyone()
    server.stop()


@pytest.fixture
def proxy(s3, monkeypatch):
    """A proxy in front of moto; boto3 reaches S3 through it via the standard variables."""
    proxy = CountingProxy(s3.url)
    for key, value in s3.env(proxy.url).items():
        monkeypatch.setenv(key, value)
    yield proxy
    proxy.close()


def total_bytes(folder: Path) -> int:
    return sum((folder / name).stat().st_size for name in SERVED)


def assert_identical(model_dir: Path, source: Path) -> None:
    assert sorted(p.name for p in model_dir.iterdir() if p.name in SERVED) == SERVED
    for name in SERVED:
        assert (model_dir / name).read_bytes() == (source / name).read_bytes(), name


def test_checkpoint_is_fetched_in_parallel_ranges_and_byte_identical(s3, proxy, tmp_path):
    phases: list[tuple[str, float]] = []

    model = ensure(
        "s3://models/tiny",
        tmp_path / "cache",
        lambda phase, f: phases.append((phase, f)),
        options=OPTIONS,
    )

    assert_identical(model.path, s3.source_dir)
    assert not (model.path / "pytorch_model.bin").exists()
    assert model.max_model_len == 256
    assert model.size_bytes == total_bytes(s3.source_dir)
    # 2 shards of 9 MiB in 2 MiB ranges, fetched over several connections at once.
    assert proxy.range_requests >= 10
    assert proxy.max_open >= 2
    downloads = [f for phase, f in phases if phase == "download"]
    assert downloads[-1] == 1.0 and downloads == sorted(downloads)
    manifest = json.loads(model.manifest_path.read_text())
    for entry in manifest["files"]:
        data = (s3.source_dir / entry["path"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert leftovers(tmp_path / "cache") == []
    verify(model, full=True)


def test_second_ensure_lists_but_downloads_nothing(s3, proxy, tmp_path):
    first = ensure("s3://models/tiny", tmp_path / "cache", options=OPTIONS)
    before = proxy.bytes_down

    again = ensure("s3://models/tiny", tmp_path / "cache", options=OPTIONS)

    assert again == first
    assert proxy.bytes_down - before < 64 * 1024  # one listing, no object bytes


def test_sha256_checksummed_objects_verify(s3, proxy, tmp_path):
    model = ensure("s3://models/sha", tmp_path / "cache", options=OPTIONS)
    assert_identical(model.path, s3.source_dir)


def test_bytes_corrupted_in_transit_are_refetched(s3, proxy, tmp_path):
    proxy.corrupt_chunks = 1

    model = ensure("s3://models/tiny", tmp_path / "cache", options=OPTIONS)

    assert proxy.corrupt_chunks == 0  # the flip happened...
    assert_identical(model.path, s3.source_dir)  # ...and was caught and refetched


def test_bytes_that_never_match_are_refused_and_nothing_is_published(s3, proxy, tmp_path):
    proxy.corrupt_chunks = 1000

    with pytest.raises(WeightsCorrupt, match="never matched"):
        ensure("s3://models/tiny", tmp_path / "cache", options=OPTIONS)

    assert published(tmp_path / "cache") == []
    assert leftovers(tmp_path / "cache") == []


def test_connections_cut_mid_stream_are_retried(s3, proxy, tmp_path):
    proxy.cut_connections = 3

    model = ensure("s3://models/tiny", tmp_path / "cache", options=OPTIONS)

    assert proxy.cut_connections == 0
    assert_identical(model.path, s3.source_dir)


def test_flipped_byte_in_the_cache_is_detected_and_refetched(s3, proxy, tmp_path):
    cache_dir = tmp_path / "cache"
    model = ensure("s3://models/tiny", cache_dir, options=OPTIONS)
    shard = model.path / SERVED[1]
    stat = shard.stat()
    with open(shard, "r+b") as f:
        f.seek(stat.st_size // 2)
        byte = f.read(1)
        f.seek(stat.st_size // 2)
        f.write(bytes([byte[0] ^ 0x01]))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
    before = proxy.bytes_down
    phases = []

    again = ensure("s3://models/tiny", cache_dir, lambda p, f: phases.append(p), options=OPTIONS)

    assert again.path == model.path
    assert {"verify", "download"} <= set(phases)
    assert proxy.bytes_down - before >= total_bytes(s3.source_dir)
    assert_identical(again.path, s3.source_dir)
    verify(again, full=True)


def test_wrong_credentials_are_an_auth_error_with_a_hint(s3, proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(WeightsAuthError, match="AWS_ACCESS_KEY_ID") as info:
        ensure("s3://models/tiny", tmp_path / "cache", options=OPTIONS)
    assert "SignatureDoesNotMatch" in info.value.message
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWN")
    with pytest.raises(WeightsAuthError, match="InvalidAccessKeyId"):
        ensure("s3://models/tiny", tmp_path / "cache", options=OPTIONS)
    assert published(tmp_path / "cache") == [] and leftovers(tmp_path / "cache") == []


def test_no_credentials_at_all_is_an_auth_error(s3, proxy, tmp_path, monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(WeightsAuthError, match="no usable AWS credentials"):
        ensure("s3://models/tiny", tmp_path / "cache", options=OPTIONS)


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("s3://models/absent", "there are no objects under s3://models/absent/"),
        ("s3://no-such-bucket/tiny", "NoSuchBucket"),
        ("s3://models/notes", "needs config.json and *.safetensors at its top level"),
        ("s3://models/ti", "there are no objects"),  # a prefix of a prefix is not a folder
    ],
)
def test_missing_checkpoints_are_not_found(s3, proxy, tmp_path, source, says):
    with pytest.raises(WeightsNotFound) as info:
        ensure(source, tmp_path / "cache", options=OPTIONS)
    assert says in info.value.message
    assert published(tmp_path / "cache") == [] and leftovers(tmp_path / "cache") == []


def test_unreachable_endpoint_is_transient_after_retries(tmp_path, monkeypatch, s3):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "x")
    with pytest.raises(WeightsTransientError, match="gave up after 3 attempts") as info:
        ensure("s3://models/tiny", tmp_path / "cache", options=OPTIONS)
    assert info.value.retryable
    assert "endpoint http://127.0.0.1" in info.value.message


def test_unreachable_endpoint_serves_the_cached_version_without_retrying(
    s3, proxy, tmp_path, monkeypatch, caplog
):
    model = ensure("s3://models/tiny", tmp_path / "cache", options=OPTIONS)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")

    with caplog.at_level(logging.WARNING, logger="ebb.weights_cache"):
        assert ensure("s3://models/tiny", tmp_path / "cache", options=OPTIONS) == model

    assert "serving the cached version" in caplog.text
    assert "retrying" not in caplog.text  # a cached version is not worth waiting for


def test_replaced_object_gets_a_new_entry_and_the_old_one_stays(s3, proxy, tmp_path):
    client = s3.client()
    source = write_checkpoint(tmp_path / "v1", seed=5, shard_mib=1)
    upload_dir(client, BUCKET, "moving", source)
    first = ensure("s3://models/moving", tmp_path / "cache", options=OPTIONS)
    (source / "tokenizer.json").write_text('{"version": "2.0"}')
    upload_dir(client, BUCKET, "moving", source)

    second = ensure("s3://models/moving", tmp_path / "cache", options=OPTIONS)

    assert second.path != first.path
    assert (second.path / "tokenizer.json").read_text() == '{"version": "2.0"}'
    verify(first, full=True)


# --- interrupted downloads and several processes ---------------------------------------------


def _ensure_in_child(env: dict, cache_dir: str, options: CacheOptions, results) -> None:
    os.environ.update(env)
    try:
        results.put(str(ensure("s3://models/tiny", Path(cache_dir), options=options).path))
    except Exception as e:  # reported, so the parent fails fast instead of timing out
        results.put(f"error: {e!r}")


def _journaled_bytes(cache_dir: Path) -> int:
    """Bytes of the parts the resume journals record as on disk."""
    total = 0
    for journal in (cache_dir / "tmp").glob("*.partial/.*.parts"):
        header, *done = journal.read_text().split("\n")[:-1]  # the last line may be partial
        size, part = (int(x) for x in header.split()[-2:])
        total += sum(min(part, size - int(i) * part) for i in done if i.isdigit())
    return total


def test_download_killed_half_way_resumes(s3, tmp_path):
    cache_dir = tmp_path / "cache"
    slow = CountingProxy(s3.url, delay_s_per_mib=0.5)  # ~10 s for the whole checkpoint
    options = CacheOptions(concurrency=1, part_bytes=MIB, attempts=2, backoff_s=0.05)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(
        target=_ensure_in_child, args=(s3.env(slow.url), str(cache_dir), options, results)
    )
    child.start()
    wait_until(lambda: _journaled_bytes(cache_dir) >= 6 * MIB, 60, "6 MiB on disk")
    os.kill(child.pid, signal.SIGKILL)
    child.join(timeout=30)
    slow.close()
    done_bytes = _journaled_bytes(cache_dir)
    assert done_bytes < total_bytes(s3.source_dir) / 2  # really killed half-way

    fast = CountingProxy(s3.url)
    os.environ.update(s3.env(fast.url))
    try:
        model = ensure("s3://models/tiny", cache_dir, options=options)
    finally:
        for key in s3.env():
            os.environ.pop(key, None)
        fast.close()

    assert_identical(model.path, s3.source_dir)
    assert fast.bytes_down <= total_bytes(s3.source_dir) - done_bytes + 256 * 1024
    assert leftovers(cache_dir) == []


def test_processes_racing_for_one_model_download_it_once(s3, tmp_path):
    cache_dir = tmp_path / "cache"
    counting = CountingProxy(s3.url)
    args = (s3.env(counting.url), str(cache_dir), OPTIONS)
    paths = run_in_processes(_ensure_in_child, args, count=4)
    counting.close()

    assert not [p for p in paths if p.startswith("error")], paths
    assert len(set(paths)) == 1
    size = total_bytes(s3.source_dir)
    assert size <= counting.bytes_down < 1.5 * size  # once, plus listings and headers
    assert_identical(Path(paths[0]), s3.source_dir)
    assert published(cache_dir) == [Path(paths[0]).name]


def test_a_cache_entry_synced_to_s3_as_it_is_serves_without_its_bookkeeping(s3, proxy, tmp_path):
    entry = ensure("s3://models/tiny", tmp_path / "first", options=OPTIONS)
    upload_dir(s3.client(), BUCKET, "synced", entry.path)  # manifest.json, seal.json too

    model = ensure("s3://models/synced", tmp_path / "second", options=OPTIONS)

    assert_identical(model.path, s3.source_dir)
    manifest = json.loads(model.manifest_path.read_text())
    assert sorted(f["path"] for f in manifest["files"]) == SERVED
    phases = []
    again = ensure("s3://models/synced", tmp_path / "second", lambda p, f: phases.append(p))
    assert again == model and phases == []  # sealed as published: nothing to re-verify
