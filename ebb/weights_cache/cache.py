"""`ensure()` and `verify()`: the one way weights reach a runner.

`ensure(source, cache_dir)` returns a local directory in Hugging Face layout for any
accepted source, preparing it at most once per version across processes:

1. parse the source and ask its backend to resolve the current version (a cheap
   fingerprint: a file's size and mtime, an S3 listing, a Hub commit). When the remote
   cannot be reached, the newest entry already cached for the source is served instead;
2. fast path, no lock: a published entry whose files all have their recorded sizes and
   have not been written to since they were last hashed (their stat matches the seal);
3. otherwise take the key's flock, look again (another process may have finished, and
   files that were written to are re-hashed: a match is resealed, a mismatch discards
   the entry), and build: make room under the budget, fetch or convert into a staging
   directory, verify and hash, write the manifest, rename, seal, trim to the budget.

A backend is any object with the `Backend` shape (backend.py); a new scheme plugs in with
a parser in `sources.py` and an entry in `_BACKENDS`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from operator import attrgetter
from pathlib import Path
from typing import Any

from ebb.errors import (
    EbbError,
    WeightsCorrupt,
    WeightsError,
    WeightsTransientError,
)
from ebb.weights_cache.backend import Backend, Version
from ebb.weights_cache.eviction import make_room
from ebb.weights_cache.gguf_source import GgufBackend
from ebb.weights_cache.hf_source import HfBackend
from ebb.weights_cache.local_source import LocalDirBackend
from ebb.weights_cache.manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    Progress,
    check_hf_layout,
    hash_files,
    max_model_len,
    mismatched,
    missing_or_resized,
    model_files,
    now_iso,
    read_config,
    read_manifest,
    write_manifest,
)
from ebb.weights_cache.options import CacheOptions
from ebb.weights_cache.s3_source import S3Backend
from ebb.weights_cache.sources import Source, SourceKind, parse_source
from ebb.weights_cache.store import Store, entry_key

logger = logging.getLogger(__name__)

_by_path = attrgetter("path")


@dataclass(frozen=True)
class LocalModel:
    """A model ready to load: `path` is a directory in Hugging Face layout."""

    source: str  # the source URI as the caller gave it
    path: Path
    max_model_len: int  # from config.json (max_position_embeddings)
    size_bytes: int
    manifest_path: Path | None = None  # what `verify()` checks the files against


@dataclass(frozen=True)
class Layout:
    """What a cache entry holds: `check(root)` refuses (WeightsError) a directory its
    reader could not load, before it is published; `context_len(root)` is the
    LocalModel's max_model_len (0 where that means nothing, e.g. an adapter)."""

    check: Callable[[Path], object]
    context_len: Callable[[Path], int]


# A Hugging Face checkpoint vLLM loads: every model's layout.
HF_LAYOUT = Layout(check_hf_layout, lambda root: max_model_len(read_config(root), root))

# Sources whose current version is asked of a server that may be unreachable.
_REMOTE = (SourceKind.S3, SourceKind.HF)
# Each kind's backend reads that kind's Source class only; mypy cannot tie a key to its
# value, so they are Backend[Any] here, and _backend_for pairs them by the source's kind.
_BACKENDS: dict[SourceKind, Callable[[CacheOptions], Backend[Any]]] = {
    SourceKind.GGUF: lambda options: GgufBackend(),
    SourceKind.LOCAL: lambda options: LocalDirBackend(),
    SourceKind.S3: S3Backend,
    SourceKind.HF: HfBackend,
}

# Use locks this process holds for models returned by ensure(..., hold=True).
_held: dict[LocalModel, list[int]] = {}
_held_lock = threading.Lock()


@dataclass(frozen=True)
class _Job:
    """One ensure() call, resolved: which entry it wants and who can build it."""

    given: str  # the source as the caller spelled it, echoed in LocalModel.source
    source: Source
    backend: Backend[Any]
    version: Version
    key: str
    layout: Layout = HF_LAYOUT

    def model(self, root: Path, manifest: Manifest, entry_dir: Path) -> LocalModel:
        context_len = self.layout.context_len(root)
        return LocalModel(
            self.given, root, context_len, manifest.size_bytes, entry_dir / MANIFEST_NAME
        )


def ensure(
    source: str,
    cache_dir: Path,
    progress: Progress | None = None,
    *,
    options: CacheOptions | None = None,
    hold: bool = False,
    layout: Layout = HF_LAYOUT,
) -> LocalModel:
    """A local HF-layout copy of `source`, prepared once per version and cached.

    `progress(phase, fraction)` is called, when given, with phases "download" (S3 and Hub
    sources), "convert" (GGUF), "hash", "verify" (files written to since they were last
    hashed) and "publish"; a cached model reports nothing. With `hold`, the entry is in use
    by this process, and never evicted, until `release(model)` or the process exits.
    Raises InvalidRequest for a source that is malformed (see `parse_source`),
    WeightsNotFound / WeightsAuthError / WeightsTransientError (after retries) from the
    remote, WeightsError when it cannot be prepared; nothing half-written is published.
    `layout` is what the entry must hold (a LoRA adapter's: `ebb.weights_cache.adapters`).
    """
    options = options or CacheOptions()
    parsed = parse_source(source)
    store = Store(cache_dir)
    backend, version, key = _resolve(store, parsed, options)
    job = _Job(source, parsed, backend, version, key, layout)
    held = store.hold(key) if hold else None
    try:
        model = _ensure_locked(store, job, progress, options)
    except BaseException:
        if held is not None:
            store.release(held)
        raise
    store.touch(job.key)
    if held is not None:
        with _held_lock:
            _held.setdefault(model, []).append(held)
    return model


def release(model: LocalModel) -> None:
    """Stop holding `model` (see `ensure(hold=True)`); a no-op when it is not held."""
    with _held_lock:
        fds = _held.get(model)
        if not fds:
            return
        fd = fds.pop()
        if not fds:
            del _held[model]
    Store.release(fd)


def _ensure_locked(
    store: Store, job: _Job, progress: Progress | None, options: CacheOptions
) -> LocalModel:
    model, problem = _lookup(store, job, recheck=False)
    if model is None:
        with store.lock(job.key):
            model, problem = _lookup(store, job, recheck=True, progress=progress)
            if model is None:
                model = _build(store, job, problem, progress, options)
    return model


def _resolve(
    store: Store, parsed: Source, options: CacheOptions
) -> tuple[Backend[Any], Version, str]:
    """The backend, the source's current version and its entry key.

    A remote source with a version already cached is asked once, without retries: when it
    cannot be reached, that version is served at once rather than after every backoff.
    """
    backend = _backend_for(parsed, options)
    cached = _last_known(store, parsed.uri) if parsed.kind in _REMOTE else None
    resolver = _backend_for(parsed, replace(options, attempts=1)) if cached else backend
    try:
        version = resolver.resolve(parsed)
    except WeightsTransientError as e:
        if cached is None:
            raise
        logger.warning(
            "weights: %s is unreachable (%s); serving the cached version %s",
            parsed.uri,
            e.message,
            cached.key,
        )
        return backend, Version(cached.fingerprint), cached.key
    return backend, version, entry_key(parsed.uri, version.fingerprint, parsed.name)


def cached_manifest(source: str, cache_dir: Path) -> tuple[Manifest, Path] | None:
    """The newest cached entry of `source` and the directory its files are in, without
    fetching, converting or checking anything; None when nothing of it is cached."""
    store = Store(cache_dir)
    manifest = _last_known(store, parse_source(source).uri)
    if manifest is None:
        return None
    return manifest, Path(manifest.root) if manifest.root else store.entry_dir(manifest.key)


def _last_known(store: Store, uri: str) -> Manifest | None:
    """The newest published entry of `uri`, if any."""
    newest = None
    if store.models_dir.exists():
        for entry_dir in store.models_dir.iterdir():
            manifest = store.read(entry_dir.name)
            if manifest is None or manifest.source != uri:
                continue
            if newest is None or manifest.created_at > newest.created_at:
                newest = manifest
    return newest


def verify(model: LocalModel, full: bool = True, progress: Progress | None = None) -> None:
    """Check `model`'s files against its manifest: sizes, and with `full` every sha256.

    Raises WeightsCorrupt naming the first bad file. A corrupt entry the store owns is
    removed first (under its lock), so the next `ensure()` rebuilds it.
    """
    if model.manifest_path is None:
        raise WeightsError(f"{model.source} has no manifest; it did not come from ensure()")
    entry_dir = model.manifest_path.parent
    manifest = read_manifest(entry_dir)
    if manifest is None:
        raise WeightsCorrupt(f"{model.source}: manifest {model.manifest_path} is missing")
    if full:
        problem = mismatched(model.path, manifest, progress)
    else:
        problem = missing_or_resized(model.path, manifest, check_mtime=False)
    if problem is None:
        if manifest.root is None and full:
            Store(entry_dir.parent.parent).seal(manifest.key, model.path, _names(manifest))
        return
    if manifest.root is None:
        _discard_if_unchanged(Store(entry_dir.parent.parent), manifest, problem)
    raise WeightsCorrupt(f"weights of {model.source} are corrupt: {problem}")


def _backend_for(source: Source, options: CacheOptions) -> Backend[Any]:
    return _BACKENDS[source.kind](options)


def _lookup(
    store: Store, job: _Job, *, recheck: bool, progress: Progress | None = None
) -> tuple[LocalModel | None, str | None]:
    """(the published model, None) or (None, why there is no usable entry, if one exists).

    With `recheck` (call with the key's lock held), files written to since they were last
    hashed are hashed again, and the entry is resealed when they still match.
    """
    manifest = store.read(job.key)
    if manifest is None:
        exists = store.entry_dir(job.key).exists()
        return None, ("its manifest is missing or unreadable" if exists else None)
    root = Path(manifest.root) if manifest.root else store.entry_dir(job.key)
    problem = missing_or_resized(root, manifest, check_mtime=job.backend.in_place)
    if problem is None and manifest.root is None:
        problem = _check_seal(store, manifest, root, recheck, progress)
    if problem is not None:
        return None, problem
    try:
        return job.model(root, manifest, store.entry_dir(job.key)), None
    except WeightsError as e:
        # Discarded under our feet, or a local config.json gone bad: rebuilding under
        # the lock either finds the new entry or raises a precise error.
        return None, e.message


def _check_seal(
    store: Store, manifest: Manifest, root: Path, recheck: bool, progress: Progress | None
) -> str | None:
    changed = store.unsealed(manifest.key, root, _names(manifest))
    if not changed:
        return None
    if not recheck:
        return f"{', '.join(changed)} changed on disk since last verified"
    wanted = {entry.path: entry for entry in manifest.files}
    for actual in hash_files(root, changed, progress, phase="verify"):
        if actual.sha256 != wanted[actual.path].sha256:
            return (
                f"{actual.path} has sha256 {actual.sha256[:12]}..., "
                f"expected {wanted[actual.path].sha256[:12]}..."
            )
    logger.info("weights: %s re-verified after a change on disk: %s", manifest.key, changed)
    store.seal(manifest.key, root, _names(manifest))
    return None


def _names(manifest: Manifest) -> list[str]:
    return [entry.path for entry in manifest.files]


def _build(
    store: Store, job: _Job, problem: str | None, progress: Progress | None, options: CacheOptions
) -> LocalModel:
    """Prepare, manifest and publish `job.key`; call with its lock held."""
    started = time.monotonic()
    in_place = job.backend.in_place
    if problem is not None:
        logger.warning("weights: rebuilding %s: %s", job.key, problem)
    store.clean_stale(job.key)
    if not in_place:
        make_room(store, options.budget_bytes, job.version.size_bytes or 0, keep=job.key)
    try:
        with store.staging(job.key, resumable=job.backend.resumable) as staged:
            root = job.backend.root(job.source) if in_place else staged
            hashed: Mapping[str, FileEntry] = {}
            if not in_place:
                hashed = job.backend.fetch(job.source, job.version, staged, progress) or {}
            job.layout.check(root)
            names = model_files(root)
            fresh = hash_files(
                root, [n for n in names if n not in hashed], progress, durable=not in_place
            )
            files = sorted([*fresh, *(hashed[n] for n in names if n in hashed)], key=_by_path)
            manifest = Manifest(
                source=job.source.uri,
                key=job.key,
                files=tuple(files),
                created_at=now_iso(),
                fingerprint=job.version.fingerprint,
                root=str(root) if in_place else None,
            )
            write_manifest(staged, manifest)
            _report(progress, "publish", 0.0)
            # A no-op unless a broken entry is in the way; rename cannot replace a full dir.
            store.discard(job.key, problem or "replaced by a fresh build")
            entry = store.publish(job.key, staged)
    except EbbError:
        raise
    except Exception as e:
        raise WeightsError(f"preparing {job.source.uri} failed: {type(e).__name__}: {e}") from e
    if not in_place:
        store.seal(job.key, entry, names)
        make_room(store, options.budget_bytes, 0, keep=job.key)
    _report(progress, "publish", 1.0)
    logger.info(
        "weights: published %s as %s (%d bytes, %.1fs)",
        job.source.uri,
        entry.name,
        manifest.size_bytes,
        time.monotonic() - started,
    )
    return job.model(root if in_place else entry, manifest, entry)


def _discard_if_unchanged(store: Store, manifest: Manifest, problem: str) -> None:
    # Under the lock and only if the entry is still the one we checked: another process
    # may have rebuilt it meanwhile, and that fresh entry must survive.
    with store.lock(manifest.key):
        if store.read(manifest.key) == manifest:
            store.discard(manifest.key, problem)


def _report(progress: Progress | None, phase: str, fraction: float) -> None:
    if progress is not None:
        progress(phase, fraction)
