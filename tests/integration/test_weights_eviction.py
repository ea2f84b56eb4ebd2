"""Eviction under a byte budget: least recently used first, never a model a live process
holds, every eviction recorded. Models are GGUF sources with a stand-in converter (the
real conversion is in tests/e2e), so each entry owns its bytes like a fetched one.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest
from support.weights import write_hf_dir

from ebb.weights_cache import CacheOptions, cache_report, ensure, gguf_source, release, verify

pytestmark = pytest.mark.integration


@pytest.fixture
def models(tmp_path, monkeypatch):
    """make(name) -> a gguf: source whose (stand-in) conversion writes a tiny checkpoint."""
    monkeypatch.setattr(
        gguf_source, "convert_gguf", lambda gguf, dest, progress: write_hf_dir(dest, seed=1)
    )

    def make(name: str) -> str:
        gguf = tmp_path / "src" / f"{name}.gguf"
        if not gguf.exists():  # rewriting it would make a new version
            gguf.parent.mkdir(exist_ok=True)
            gguf.write_bytes(b"GGUF" + name.encode())
        return f"gguf:{gguf}"

    return make


def cached(cache_dir: Path) -> list[str]:
    """The names of the models in the cache (entry keys start with the GGUF file's stem)."""
    return sorted(p.name.rsplit("-", 1)[0] for p in (cache_dir / "models").iterdir())


def age(model, seconds_ago: float) -> None:
    """Pretend `model` was last used `seconds_ago` (LRU order without sleeping)."""
    stamp = model.path / "last_access"
    when = stamp.stat().st_mtime - seconds_ago
    os.utime(stamp, (when, when))


def _hold_in_child(source: str, cache_dir: str, ready, done) -> None:
    try:
        model = ensure(source, Path(cache_dir), hold=True)  # published already: no conversion
    except Exception as e:  # reported, so the parent fails fast instead of timing out
        ready.put(f"error: {e!r}")
        return
    ready.put(str(model.path))
    done.wait(timeout=120)


def test_lru_is_evicted_but_a_model_a_live_process_holds_is_kept(tmp_path, models):
    cache_dir = tmp_path / "cache"
    a, b, c = (ensure(models(n), cache_dir) for n in "abc")
    budget = a.size_bytes * 3 + a.size_bytes // 2  # room for three and a half models
    ctx = multiprocessing.get_context("spawn")
    ready, done = ctx.Queue(), ctx.Event()
    holder = ctx.Process(target=_hold_in_child, args=(models("a"), str(cache_dir), ready, done))
    holder.start()
    try:
        assert ready.get(timeout=60) == str(a.path)
        age(a, 300)  # its runner loaded it long ago
        age(b, 200)
        age(c, 100)
        report = cache_report(cache_dir, budget)
        assert {e.key: e.in_use for e in report.entries}[a.path.name] is True

        ensure(models("d"), cache_dir, options=CacheOptions(budget_bytes=budget))

        # a is the least recently used, but in use: b goes instead.
        assert cached(cache_dir) == ["a", "c", "d"]
        verify(a, full=True)
        ensure(models("e"), cache_dir, options=CacheOptions(budget_bytes=budget))
        # Found in use, a counted as used just now: c is older.
        assert cached(cache_dir) == ["a", "d", "e"]
    finally:
        done.set()
        holder.join(timeout=30)

    ensure(models("f"), cache_dir, options=CacheOptions(budget_bytes=budget))

    assert cached(cache_dir) == ["d", "e", "f"]  # a's holder exited: now it may go
    report = cache_report(cache_dir, budget)
    assert report.evictions_total == 3
    assert [e.source for e in report.recent_evictions] == [b.source, c.source, a.source]
    assert report.evicted_bytes_total == 3 * a.size_bytes
    assert report.used_bytes == 3 * a.size_bytes <= budget
    lines = (cache_dir / "evictions.jsonl").read_text().splitlines()
    assert [json.loads(line)["key"] for line in lines] == [
        b.path.name,
        c.path.name,
        a.path.name,
    ]


def test_a_hold_in_this_process_protects_until_released(tmp_path, models):
    cache_dir = tmp_path / "cache"
    held = ensure(models("held"), cache_dir, hold=True)
    budget = held.size_bytes  # room for one model only
    age(held, 100)

    ensure(models("new"), cache_dir, options=CacheOptions(budget_bytes=budget))
    assert cached(cache_dir) == ["held", "new"]  # over budget: the rest is in use

    release(held)
    ensure(models("newer"), cache_dir, options=CacheOptions(budget_bytes=budget))
    assert cached(cache_dir) == ["newer"]


def test_a_model_larger_than_the_budget_is_still_served(tmp_path, models):
    cache_dir = tmp_path / "cache"
    model = ensure(models("big"), cache_dir, options=CacheOptions(budget_bytes=1))
    assert cached(cache_dir) == ["big"]  # the entry just published is never the victim
    verify(model, full=True)


def test_an_abandoned_partial_download_counts_and_goes_first(tmp_path, models):
    cache_dir = tmp_path / "cache"
    kept = ensure(models("kept"), cache_dir)
    partial = cache_dir / "tmp" / "gone-0123456789abcdef0123.partial"
    partial.mkdir(parents=True)
    (partial / "model.safetensors").write_bytes(b"\0" * kept.size_bytes)
    os.utime(partial, (0, 0))  # older than anything
    report = cache_report(cache_dir, None)
    assert report.used_bytes == 2 * kept.size_bytes
    assert [e.partial for e in report.entries] == [False, True]

    ensure(models("next"), cache_dir, options=CacheOptions(budget_bytes=2 * kept.size_bytes))

    assert not partial.exists()
    assert cached(cache_dir) == ["kept", "next"]


def test_no_budget_never_evicts(tmp_path, models):
    cache_dir = tmp_path / "cache"
    for name in "wxyz":
        ensure(models(name), cache_dir)
    assert cached(cache_dir) == ["w", "x", "y", "z"]
    assert cache_report(cache_dir, None).evictions_total == 0
