"""Keeping the cache under its byte budget: least recently used first, never in use.

An entry is in use while some process holds its use lock (a runner holds it from
`ensure(..., hold=True)` until it exits; the kernel drops it if the runner dies), and an
entry is being built or checked while its key lock is held: eviction takes both without
waiting, and skips what it cannot take. Entries used in place (local directories) cost
the cache nothing and are never evicted. Interrupted downloads (`tmp/*.partial`) count
against the budget and are evicted like entries, by their last write.

Every eviction is appended to `evictions.jsonl`, which `cache_report` (the frontdoor's
metrics and `ebb status`) reads back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ebb.weights_cache.manifest import ACCESS_NAME, now_iso
from ebb.weights_cache.store import EVICTIONS_NAME, PARTIAL_SUFFIX, Store

logger = logging.getLogger(__name__)

_RECENT_EVICTIONS = 20


@dataclass(frozen=True)
class EntryInfo:
    key: str
    source: str  # "" when the manifest is unreadable, or for a partial download
    size_bytes: int  # bytes the cache holds for it (0 for an entry used in place)
    last_access_s: float
    partial: bool = False
    in_use: bool = False


@dataclass(frozen=True)
class Eviction:
    at: str
    key: str
    source: str
    size_bytes: int
    reason: str


@dataclass
class CacheReport:
    """What `ebb status` and /metrics show of one cache directory."""

    cache_dir: str
    budget_bytes: int | None
    used_bytes: int
    entries: list[EntryInfo]
    evictions_total: int = 0
    evicted_bytes_total: int = 0
    recent_evictions: list[Eviction] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def eviction_order(entries: list[EntryInfo]) -> list[EntryInfo]:
    """Candidates, least recently used first; entries that hold no bytes are never worth it."""
    return sorted((e for e in entries if e.size_bytes > 0), key=lambda e: e.last_access_s)


def make_room(
    store: Store, budget_bytes: int | None, incoming_bytes: int, keep: str | None = None
) -> list[Eviction]:
    """Evict until the cache plus `incoming_bytes` fits `budget_bytes`, or nothing more can
    go. `keep` (the entry being built or just published) is never a candidate. What stays
    over budget because it is in use is logged; the budget is a target, not a refusal."""
    if budget_bytes is None:
        return []
    with _evicting(store):
        entries = scan(store)
        over = sum(e.size_bytes for e in entries) + incoming_bytes - budget_bytes
        evicted: list[Eviction] = []
        for entry in eviction_order(entries):
            if over <= 0:
                break
            if entry.key == keep:
                continue
            done = _evict(store, entry, f"LRU: {over} bytes over the budget of {budget_bytes}")
            if done is not None:
                evicted.append(done)
                over -= entry.size_bytes
        if over > 0:
            logger.warning(
                "weights: cache stays %d bytes over its budget of %d: the rest is in use",
                over,
                budget_bytes,
            )
        return evicted


def scan(store: Store) -> list[EntryInfo]:
    """Every entry and partial download, with the bytes it holds and when it was last used."""
    found = []
    if store.models_dir.exists():
        for entry_dir in store.models_dir.iterdir():
            manifest = store.read(entry_dir.name)
            if manifest is not None and manifest.root is not None:
                size = 0  # used in place: the files are not the cache's
            else:
                size = manifest.size_bytes if manifest is not None else _du(entry_dir)
            source = manifest.source if manifest is not None else ""
            found.append(EntryInfo(entry_dir.name, source, size, _mtime(entry_dir / ACCESS_NAME)))
    if store.tmp_dir.exists():
        for partial in store.tmp_dir.glob(f"*{PARTIAL_SUFFIX}"):
            key = partial.name.removesuffix(PARTIAL_SUFFIX)
            found.append(EntryInfo(key, "", _du(partial), _mtime(partial), partial=True))
    return found


def cache_report(cache_dir: Path, budget_bytes: int | None) -> CacheReport:
    store = Store(cache_dir)
    entries = []
    for entry in scan(store):
        with store.try_unused(entry.key) as unused:
            entries.append(EntryInfo(**{**asdict(entry), "in_use": not unused}))
    entries.sort(key=lambda e: -e.last_access_s)
    evictions = read_evictions(store)
    return CacheReport(
        cache_dir=str(store.root),
        budget_bytes=budget_bytes,
        used_bytes=sum(e.size_bytes for e in entries),
        entries=entries,
        evictions_total=len(evictions),
        evicted_bytes_total=sum(e.size_bytes for e in evictions),
        recent_evictions=evictions[-_RECENT_EVICTIONS:],
    )


def read_evictions(store: Store) -> list[Eviction]:
    try:
        lines = (store.root / EVICTIONS_NAME).read_text().splitlines()
    except FileNotFoundError:
        return []
    found = []
    for line in lines:
        with contextlib.suppress(ValueError, TypeError):
            found.append(Eviction(**json.loads(line)))
    return found


def _evict(store: Store, entry: EntryInfo, reason: str) -> Eviction | None:
    with store.try_lock(entry.key) as locked, store.try_unused(entry.key) as unused:
        if not locked or not unused:
            logger.info("weights: not evicting %s: in use", entry.key)
            # In use means used now: once its runner exits, it ranks as recently used.
            store.touch(entry.key)
            return None
        if entry.partial:
            _remove(store, store.tmp_dir / f"{entry.key}{PARTIAL_SUFFIX}")
        else:
            store.discard(entry.key, reason)
    done = Eviction(now_iso(), entry.key, entry.source, entry.size_bytes, reason)
    logger.info("weights: evicted %s (%s, %d bytes)", entry.key, entry.source, entry.size_bytes)
    line = json.dumps(asdict(done)) + "\n"
    # One short O_APPEND write per line: concurrent evictors never interleave.
    fd = os.open(store.root / EVICTIONS_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return done


@contextlib.contextmanager
def _evicting(store: Store) -> Iterator[None]:
    # One evictor at a time per cache: two would both count the same bytes as over.
    with store.lock("evict"):
        yield


def _remove(store: Store, path: Path) -> None:
    doomed = store.tmp_dir / f"evicted.{uuid.uuid4().hex[:8]}"
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _du(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file():
                total += p.stat().st_size
    return total


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()
