"""`hf://org/name@revision` sources: a Hub repository through `snapshot_download`.

The revision is resolved to a commit first (a commit id needs no network at all), so a
branch that moves gets a new cache entry and the old one stays intact for its readers.
Only what serving needs is fetched (`FETCH_PATTERNS`); every file is then checked against
the Hub's own listing: LFS files by their sha256, small files by their git blob id.

`HF_TOKEN` and `HF_ENDPOINT` are read when a fetch starts (not when huggingface_hub was
imported). An `hf://` source is an explicit request to reach the Hub, so the offline flag
runners set for vLLM's own lookups (HF_HUB_OFFLINE) is lifted for the fetch itself.
huggingface_hub is imported inside functions: importing the weight cache stays cheap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ebb.errors import (
    WeightsAuthError,
    WeightsError,
    WeightsNotFound,
    WeightsTransientError,
)
from ebb.weights_cache.backend import Version, wanted
from ebb.weights_cache.checksums import Expected, digest_file, fetch_until_verified
from ebb.weights_cache.manifest import FileEntry, Progress
from ebb.weights_cache.options import CacheOptions
from ebb.weights_cache.retry import with_retries
from ebb.weights_cache.sources import HfSource

if TYPE_CHECKING:
    from huggingface_hub import HfApi

logger = logging.getLogger(__name__)

T = TypeVar("T")

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_POLL_S = 0.5
_TOKEN_HINT = "set HF_TOKEN to a token of an account that may read it"
_TRANSIENT_NAME_RE = re.compile(r"Connect|Timeout|Network|Protocol|ReadError")
# How many fetches in this process lifted the offline flag, and its value before them.
_online_lock = threading.Lock()
_online_users = 0
_saved_offline = False

# A model's config.json, or a LoRA adapter's (served by a base; see weights_cache.adapters).
_CONFIG_NAMES = frozenset({"config.json", "adapter_config.json"})


@dataclass(frozen=True)
class _HubFile:
    name: str
    size_bytes: int
    blob_id: str
    lfs_sha256: str | None

    def expected(self) -> Expected:
        if self.lfs_sha256:
            return Expected(self.size_bytes, sha256_hex=self.lfs_sha256)
        return Expected(self.size_bytes, git_sha1_hex=self.blob_id)


class HfBackend:
    """Backend for `hf://` sources; the store owns the fetched files."""

    in_place = False
    resumable = True

    def __init__(self, options: CacheOptions):
        self.options = options

    def resolve(self, source: HfSource) -> Version:
        if _COMMIT_RE.match(source.revision):
            return Version(f"hf:{source.revision}", detail=source.revision)
        info = self._call(
            lambda api: api.repo_info(source.repo_id, revision=source.revision),
            f"resolving {source.uri}",
        )
        return Version(f"hf:{info.sha}", detail=info.sha)

    def root(self, source: HfSource) -> Path:
        raise NotImplementedError("Hub sources are fetched into the store")

    def fetch(
        self, source: HfSource, version: Version, dest: Path, progress: Progress | None
    ) -> dict[str, FileEntry]:
        commit = cast(str, version.detail)  # what this backend's resolve() read
        files = self._list(source, commit)
        started = time.monotonic()
        entries: dict[str, FileEntry] = {}

        def fetch_round() -> list[str]:
            with _report_sizes(dest, sum(f.size_bytes for f in files), progress):
                self._download(source, commit, [f.name for f in files], dest)
            return _verify(dest, files, entries)

        fetch_until_verified(fetch_round, source.uri, "Check the repository on the Hub.")
        shutil.rmtree(dest / ".cache", ignore_errors=True)  # the Hub client's bookkeeping
        logger.info(
            "weights: fetched %s at %s: %d files, %d bytes in %.1fs",
            source.uri,
            commit[:12],
            len(files),
            sum(f.size_bytes for f in files),
            time.monotonic() - started,
        )
        return entries

    def _list(self, source: HfSource, commit: str) -> list[_HubFile]:
        from huggingface_hub.hf_api import RepoFile

        tree = self._call(
            lambda api: list(api.list_repo_tree(source.repo_id, revision=commit)),
            f"listing {source.uri}",
        )
        files = [
            _HubFile(e.path, e.size, e.blob_id, e.lfs.sha256 if e.lfs else None)
            for e in tree
            if isinstance(e, RepoFile) and wanted(e.path)
        ]
        names = {f.name for f in files}
        if _CONFIG_NAMES.isdisjoint(names) or not any(n.endswith(".safetensors") for n in names):
            shown = ", ".join(sorted(e.path for e in tree)[:12]) or "nothing"
            raise WeightsNotFound(
                f"{source.uri} is not a checkpoint vLLM can serve from safetensors: it needs "
                f"config.json and *.safetensors at its top level, and holds: {shown}"
            )
        return files

    def _download(self, source: HfSource, commit: str, names: list[str], dest: Path) -> None:
        from huggingface_hub import snapshot_download

        self._call(
            lambda api: snapshot_download(
                source.repo_id,
                revision=commit,
                local_dir=dest,
                allow_patterns=names,
                endpoint=api.endpoint,
                token=api.token,
                max_workers=max(1, self.options.concurrency),
                tqdm_class=_quiet_bars(),
            ),
            f"downloading {source.uri}",
        )

    def _call(self, call: Callable[[HfApi], T], what: str) -> T:
        def attempt() -> T:
            from huggingface_hub import HfApi

            api = HfApi(endpoint=os.environ.get("HF_ENDPOINT"), token=os.environ.get("HF_TOKEN"))
            try:
                with _hub_online():
                    return call(api)
            except Exception as e:
                raise map_hf_error(e, what) from e

        return with_retries(attempt, what, self.options.attempts, self.options.backoff_s)


def _quiet_bars() -> type[Any]:
    """A tqdm that draws nothing: progress goes to the caller, not to a server's log."""
    from tqdm.auto import tqdm

    class Quiet(tqdm):  # type: ignore[misc] # tqdm publishes no types: it is Any
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Quiet


def _verify(dest: Path, files: list[_HubFile], entries: dict[str, FileEntry]) -> list[str]:
    """Check each file against the Hub's listing; drop the bad ones (refetched next)."""
    bad = []
    for f in files:
        if f.name in entries:
            continue
        if not (dest / f.name).is_file():
            raise WeightsTransientError(f"{f.name} is missing after the download; retry")
        entry, problem = digest_file(dest, f.name, f.expected())
        if problem is None:
            entries[f.name] = entry
        else:
            bad.append(problem)
            (dest / f.name).unlink()
    return bad


@contextlib.contextmanager
def _report_sizes(dest: Path, total: int, progress: Progress | None) -> Iterator[None]:
    """Report the bytes on disk under `dest` (partial files included) while downloading:
    sturdier than hooking the Hub client's progress bars, which change between versions."""
    stop = threading.Event()

    def poll(report: Progress) -> None:
        while not stop.wait(_POLL_S):
            size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
            report("download", min(size / max(total, 1), 1.0))

    thread = threading.Thread(target=poll, args=(progress,), name="hf-progress", daemon=True)
    if progress is not None:
        progress("download", 0.0)
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if progress is not None:
            thread.join()
            progress("download", 1.0)


@contextlib.contextmanager
def _hub_online() -> Iterator[None]:
    import huggingface_hub.constants as hub_constants

    global _online_users, _saved_offline
    with _online_lock:
        if _online_users == 0:
            _saved_offline = hub_constants.HF_HUB_OFFLINE
            hub_constants.HF_HUB_OFFLINE = False
        _online_users += 1
    try:
        yield
    finally:
        with _online_lock:
            _online_users -= 1
            if _online_users == 0:
                hub_constants.HF_HUB_OFFLINE = _saved_offline


def map_hf_error(error: Exception, what: str) -> WeightsError:
    """A huggingface_hub failure as the weights error a caller can act on."""
    if isinstance(error, WeightsError):
        return error
    from huggingface_hub import errors as hub

    if isinstance(error, hub.GatedRepoError):
        return WeightsAuthError(
            f"{what}: the repository is gated; accept its terms on the Hub and {_TOKEN_HINT}"
        )
    if isinstance(error, hub.RevisionNotFoundError):
        return WeightsNotFound(f"{what}: no such branch, tag or commit on the Hub")
    if isinstance(error, hub.RepositoryNotFoundError):
        return WeightsNotFound(
            f"{what}: the Hub has no such repository visible to this token; check the name, "
            f"or, for a private repository, {_TOKEN_HINT}"
        )
    if isinstance(error, hub.LocalEntryNotFoundError | hub.OfflineModeIsEnabled):
        return WeightsTransientError(f"{what}: the Hub could not be reached: {error}")
    if isinstance(error, hub.EntryNotFoundError):
        return WeightsNotFound(f"{what}: a file listed by the Hub is missing: {error}")
    if isinstance(error, hub.HfHubHTTPError):
        status = error.response.status_code if error.response is not None else 0
        if status in (401, 403):
            return WeightsAuthError(f"{what}: the Hub refused the token ({status}); {_TOKEN_HINT}")
        if status == 429 or status >= 500:
            return WeightsTransientError(f"{what}: the Hub answered {status}")
        return WeightsError(f"{what}: the Hub answered {status}: {error}")
    if isinstance(error, OSError | TimeoutError) or _TRANSIENT_NAME_RE.search(type(error).__name__):
        endpoint = os.environ.get("HF_ENDPOINT", "the Hub")
        return WeightsTransientError(f"{what}: cannot reach {endpoint}: {error}")
    return WeightsError(f"{what}: {type(error).__name__}: {error}")
