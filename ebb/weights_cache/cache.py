"""`ensure()` and `verify()`: the one way weights reach a runner.

`ensure(source, cache_dir)` returns a local directory in Hugging Face layout for any
accepted source, preparing it at most once per version across processes:

1. parse the source and ask its backend for a cheap fingerprint of the current version;
2. fast path, no lock: a published entry whose files all have their recorded sizes;
3. otherwise take the key's flock, look again (another process may have finished), and
   build: fetch or convert into a staging directory, hash, write the manifest, rename.

A backend is any object with the `Backend` shape; s3:// and hf:// plug in by adding a
parser in `sources.py` and an entry in `_BACKENDS`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ebb.errors import EbbError, InvalidRequest, WeightsCorrupt, WeightsError
from ebb.weights_cache.gguf_source import GgufBackend
from ebb.weights_cache.local_source import LocalDirBackend
from ebb.weights_cache.manifest import (
    MANIFEST_NAME,
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
from ebb.weights_cache.sources import Source, SourceKind, parse_source
from ebb.weights_cache.store import Store, entry_key

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalModel:
    """A model ready to load: `path` is a directory in Hugging Face layout."""

    source: str  # the source URI as the caller gave it
    path: Path
    max_model_len: int  # from config.json (max_position_embeddings)
    size_bytes: int
    manifest_path: Path | None = None  # what `verify()` checks the files against


class Backend(Protocol):
    """How one kind of source reaches the store.

    `fingerprint` is cheap (no hashing of large files) and changes whenever the source's
    content does; it raises WeightsNotFound when the source does not exist. An `in_place`
    backend's files stay where they are (`root`); any other backend's `fetch` writes the
    model in HF layout into an empty directory and raises WeightsError subclasses.
    """

    in_place: bool

    def fingerprint(self, source: Source) -> str: ...

    def root(self, source: Source) -> Path: ...

    def fetch(self, source: Source, dest: Path, progress: Progress | None) -> None: ...


_BACKENDS: dict[SourceKind, Backend] = {
    SourceKind.GGUF: GgufBackend(),
    SourceKind.LOCAL: LocalDirBackend(),
}


@dataclass(frozen=True)
class _Job:
    """One ensure() call, resolved: which entry it wants and who can build it."""

    given: str  # the source as the caller spelled it, echoed in LocalModel.source
    source: Source
    backend: Backend
    fingerprint: str
    key: str

    def model(self, root: Path, manifest: Manifest, entry_dir: Path) -> LocalModel:
        context_len = max_model_len(read_config(root), root)
        return LocalModel(
            self.given, root, context_len, manifest.size_bytes, entry_dir / MANIFEST_NAME
        )


def ensure(source: str, cache_dir: Path, progress: Progress | None = None) -> LocalModel:
    """A local HF-layout copy of `source`, prepared once per version and cached.

    `progress(phase, fraction)` is called, when given, with phases "convert" (GGUF
    sources), "hash" and "publish"; a cached model reports nothing. Raises InvalidRequest
    for a source that is malformed or has no weights (fake://), WeightsNotFound when it
    does not exist, WeightsError when it cannot be prepared; nothing half-written is left.
    """
    parsed = parse_source(source)
    backend = _backend_for(parsed)
    fingerprint = backend.fingerprint(parsed)
    job = _Job(
        source, parsed, backend, fingerprint, entry_key(parsed.uri, fingerprint, parsed.name)
    )
    store = Store(cache_dir)
    model, problem = _lookup(store, job)
    if model is None:
        with store.lock(job.key):
            model, problem = _lookup(store, job)
            if model is None:
                model = _build(store, job, problem, progress)
    store.touch(job.key)
    return model


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
        return
    if manifest.root is None:
        _discard_if_unchanged(Store(entry_dir.parent.parent), manifest, problem)
    raise WeightsCorrupt(f"weights of {model.source} are corrupt: {problem}")


def _backend_for(source: Source) -> Backend:
    backend = _BACKENDS.get(source.kind)
    if backend is None:
        raise InvalidRequest(
            f"{source.uri} is a {source.kind} model source with no weights to fetch "
            "(the runner serves fake:// models itself)",
            param="source",
        )
    return backend


def _lookup(store: Store, job: _Job) -> tuple[LocalModel | None, str | None]:
    """(the published model, None) or (None, why there is no usable entry, if one exists)."""
    manifest = store.read(job.key)
    if manifest is None:
        exists = store.entry_dir(job.key).exists()
        return None, ("its manifest is missing or unreadable" if exists else None)
    root = Path(manifest.root) if manifest.root else store.entry_dir(job.key)
    problem = missing_or_resized(root, manifest, check_mtime=job.backend.in_place)
    if problem is not None:
        return None, problem
    try:
        return job.model(root, manifest, store.entry_dir(job.key)), None
    except WeightsError as e:
        # Discarded under our feet, or a local config.json gone bad: rebuilding under
        # the lock either finds the new entry or raises a precise error.
        return None, e.message


def _build(store: Store, job: _Job, problem: str | None, progress: Progress | None) -> LocalModel:
    """Prepare, manifest and publish `job.key`; call with its lock held."""
    started = time.monotonic()
    store.clean_stale(job.key)
    try:
        with store.staging(job.key) as staged:
            root = job.backend.root(job.source) if job.backend.in_place else staged
            if not job.backend.in_place:
                job.backend.fetch(job.source, staged, progress)
            check_hf_layout(root)
            names = model_files(root, exclude=(MANIFEST_NAME,))
            files = hash_files(root, names, progress, durable=not job.backend.in_place)
            manifest = Manifest(
                source=job.source.uri,
                key=job.key,
                files=files,
                created_at=now_iso(),
                fingerprint=job.fingerprint,
                root=str(root) if job.backend.in_place else None,
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
    _report(progress, "publish", 1.0)
    logger.info(
        "weights: published %s as %s (%d bytes, %.1fs)",
        job.source.uri,
        entry.name,
        manifest.size_bytes,
        time.monotonic() - started,
    )
    return job.model(root if job.backend.in_place else entry, manifest, entry)


def _discard_if_unchanged(store: Store, manifest: Manifest, problem: str) -> None:
    # Under the lock and only if the entry is still the one we checked: another process
    # may have rebuilt it meanwhile, and that fresh entry must survive.
    with store.lock(manifest.key):
        if store.read(manifest.key) == manifest:
            store.discard(manifest.key, problem)


def _report(progress: Progress | None, phase: str, fraction: float) -> None:
    if progress is not None:
        progress(phase, fraction)
