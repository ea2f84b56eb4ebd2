"""The content-addressed store on local disk: layout, locking, atomic publish.

Layout under `cache_dir`:
    models/<name>-<digest>/   one published entry per model version: the model files (or,
                              for sources used in place, nothing but the manifest),
                              `manifest.json`, `seal.json` (each file's stat when it was
                              last hashed) and `last_access` (its mtime drives LRU)
    locks/<key>.lock          flock'ed while an entry is built, checked or removed
    locks/<key>.use           shared-flock'ed by every process using the entry (a live
                              runner): eviction needs it exclusively, so never takes an
                              entry in use, and the kernel drops it when a runner dies
    tmp/<key>.<pid>.<rand>/   entries being built; renamed into models/ in one step
    tmp/<key>.partial/        a resumable download in progress (kept when interrupted)
    evictions.jsonl           one line per evicted entry

The key hashes the canonical source URI and the backend's fingerprint of the version
(a GGUF file's size and mtime, for instance), so a changed source gets a new entry and
readers of the old one are never disturbed. Readers never lock: an entry is either
absent or complete, because it only appears through `os.rename` of a finished directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from ebb.errors import WeightsError, WeightsTransientError
from ebb.weights_cache.manifest import (
    ACCESS_NAME,
    MANIFEST_NAME,
    SEAL_NAME,
    Manifest,
    read_manifest,
)

logger = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".partial"
EVICTIONS_NAME = "evictions.jsonl"
_SLUG_RE = re.compile(r"[^A-Za-z0-9._-]+")
_SLUG_MAX = 48


def entry_key(source_uri: str, fingerprint: str, name: str) -> str:
    """A directory name for one version of one source: readable slug plus digest."""
    digest = hashlib.sha256(f"{source_uri}\n{fingerprint}".encode()).hexdigest()[:20]
    slug = _SLUG_RE.sub("-", name).strip("-.")[:_SLUG_MAX] or "model"
    return f"{slug}-{digest}"


class Store:
    """One cache directory. Cheap to construct; creates its folders on first use."""

    def __init__(self, cache_dir: Path):
        self.root = Path(cache_dir).resolve()
        self.models_dir = self.root / "models"
        self.locks_dir = self.root / "locks"
        self.tmp_dir = self.root / "tmp"

    def entry_dir(self, key: str) -> Path:
        return self.models_dir / key

    def read(self, key: str) -> Manifest | None:
        return read_manifest(self.entry_dir(key))

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Hold the key's cross-process lock. The kernel drops it if the holder dies, so
        a crashed conversion never wedges the others."""
        self._make_dirs()
        with open(self.locks_dir / f"{key}.lock", "a+") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                logger.info("weights: waiting for another process preparing %s", key)
                started = time.monotonic()
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                logger.info(
                    "weights: %s lock acquired after %.1fs", key, time.monotonic() - started
                )
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    @contextlib.contextmanager
    def try_lock(self, key: str) -> Iterator[bool]:
        """The key's lock if it is free now (True), without waiting (False)."""
        self._make_dirs()
        with open(self.locks_dir / f"{key}.lock", "a+") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def hold(self, key: str) -> int:
        """Mark the entry in use by this process until `release(fd)` or exit; waits while
        the entry is being evicted. Returns the descriptor holding the shared lock."""
        self._make_dirs()
        fd = os.open(self.locks_dir / f"{key}.use", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd

    @staticmethod
    def release(fd: int) -> None:
        os.close(fd)  # closing the descriptor drops its flock

    @contextlib.contextmanager
    def try_unused(self, key: str) -> Iterator[bool]:
        """True, holding the entry's use lock exclusively, when no process uses it."""
        self._make_dirs()
        fd = os.open(self.locks_dir / f"{key}.use", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def staging(self, key: str, *, resumable: bool = False) -> Iterator[Path]:
        """A directory for building `key`; removed unless published.

        A `resumable` one has a stable name and keeps its contents across attempts: it
        survives a transient failure (and a killed process), so the next build resumes.
        """
        self._make_dirs()
        if resumable:
            tmp = self.tmp_dir / f"{key}{PARTIAL_SUFFIX}"
            tmp.mkdir(exist_ok=True)
        else:
            tmp = self.tmp_dir / f"{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
            tmp.mkdir()
        keep = False
        try:
            yield tmp
        except (WeightsTransientError, KeyboardInterrupt):
            keep = resumable
            raise
        finally:
            if not keep and tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def publish(self, key: str, staged: Path) -> Path:
        """Make a finished staging directory visible as the entry, in one rename.

        Call with the key's lock held and no entry present (see `discard`).
        """
        final = self.entry_dir(key)
        (staged / ACCESS_NAME).touch()
        for path in staged.iterdir():
            # Some writers (safetensors) create 0600 files; runners may run as other users.
            path.chmod(0o644 if path.is_file() else 0o755)
        _fsync_dir(staged)
        try:
            os.rename(staged, final)
        except OSError as e:
            raise WeightsError(f"publishing {key} into {self.models_dir} failed: {e}") from e
        _fsync_dir(self.models_dir)
        return final

    def discard(self, key: str, reason: str) -> None:
        """Remove the entry (call with the lock held). It is renamed away first, so a
        reader sees either the whole entry or none of it, then deleted."""
        final = self.entry_dir(key)
        if not final.exists():
            return
        logger.warning("weights: discarding %s: %s", final, reason)
        self._make_dirs()
        doomed = self.tmp_dir / f"{key}.discarded.{uuid.uuid4().hex[:8]}"
        os.rename(final, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def clean_stale(self, key: str) -> None:
        """Remove staging directories that crashed builds of `key` left behind.

        Call with the lock held: no live process can be building `key` then.
        """
        if not self.tmp_dir.exists():
            return
        for stale in self.tmp_dir.glob(f"{key}.*"):
            if stale.name.endswith(PARTIAL_SUFFIX):
                continue  # an interrupted download: resumed, not discarded
            logger.info("weights: removing leftover %s", stale)
            shutil.rmtree(stale, ignore_errors=True)

    def touch(self, key: str) -> None:
        """Record an access for LRU eviction; best effort (a read-only cache still serves)."""
        try:
            (self.entry_dir(key) / ACCESS_NAME).touch()
        except OSError as e:
            logger.debug("weights: cannot record access to %s: %s", key, e)

    def seal(self, key: str, root: Path, names: list[str]) -> None:
        """Record each file's stat now that its content matched the manifest; best effort."""
        body = {name: _stat_signature(root / name) for name in names}
        tmp = self.entry_dir(key) / f".{SEAL_NAME}.{uuid.uuid4().hex[:8]}"
        try:
            tmp.write_text(json.dumps(body))
            os.replace(tmp, self.entry_dir(key) / SEAL_NAME)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            logger.debug("weights: cannot seal %s: %s", key, e)

    def unsealed(self, key: str, root: Path, names: list[str]) -> list[str]:
        """The files whose stat changed since they were last hashed (all, without a seal).

        Any write changes a file's ctime, and nothing can set it back, so a file whose
        stat still matches has not been modified through the filesystem since."""
        try:
            sealed = json.loads((self.entry_dir(key) / SEAL_NAME).read_text())
        except (OSError, ValueError):
            return list(names)
        if not isinstance(sealed, dict):
            return list(names)
        return [n for n in names if sealed.get(n) != _stat_signature(root / n)]

    def _make_dirs(self) -> None:
        for folder in (self.models_dir, self.locks_dir, self.tmp_dir):
            folder.mkdir(parents=True, exist_ok=True)


def manifest_path(store: Store, key: str) -> Path:
    return store.entry_dir(key) / MANIFEST_NAME


def _stat_signature(path: Path) -> list[int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
