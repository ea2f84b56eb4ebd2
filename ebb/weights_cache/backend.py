"""The seam between `ensure()` and one kind of source: how its weights reach the store."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from ebb.weights_cache.manifest import BOOKKEEPING_NAMES, FileEntry, Progress
from ebb.weights_cache.sources import Source

# What a remote checkpoint needs to be served: weights, configs, tokenizer files. Other
# formats (.bin, .pth, .gguf) and subfolders (original/) would only cost bandwidth.
FETCH_PATTERNS = (
    "*.safetensors",
    "*.json",
    "tokenizer.model",
    "*.tiktoken",
    "*.txt",
    "*.jinja",
)


def wanted(name: str) -> bool:
    """Whether a top-level file of a remote checkpoint is fetched."""
    if "/" in name or name in BOOKKEEPING_NAMES:
        return False
    return any(fnmatch.fnmatchcase(name, p) for p in FETCH_PATTERNS)


# The sources one backend reads (contravariant: a backend of every source reads each kind).
SourceT = TypeVar("SourceT", bound=Source, contravariant=True)


@dataclass(frozen=True)
class Version:
    """One version of a source, as its backend resolved it.

    `fingerprint` changes whenever the source's content does (it is part of the store key);
    `size_bytes` is what a fetch will write, when the source says so up front (eviction
    makes room for it first); `detail` is the backend's own listing, handed back to `fetch`
    so it downloads exactly the version that was fingerprinted.
    """

    fingerprint: str
    size_bytes: int | None = None
    detail: object = None


class Backend(Protocol[SourceT]):
    """How one kind of source reaches the store.

    `resolve` is cheap (a listing at most, no hashing of large files) and raises
    WeightsNotFound when the source does not exist, WeightsAuthError when it may not be
    read, WeightsTransientError when it could not be reached. An `in_place` backend's files
    stay where they are (`root`); any other backend's `fetch` writes the model in HF layout
    into `dest` and returns the FileEntry of each file it already hashed while verifying it
    (the rest are hashed by the caller). A `resumable` backend's `dest` keeps what an
    interrupted fetch wrote, and `fetch` continues from there.
    """

    in_place: bool
    resumable: bool

    def resolve(self, source: SourceT) -> Version: ...

    def root(self, source: SourceT) -> Path: ...

    def fetch(
        self, source: SourceT, version: Version, dest: Path, progress: Progress | None
    ) -> Mapping[str, FileEntry] | None: ...
