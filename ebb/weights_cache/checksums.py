"""Checking fetched bytes against what their source says they hash to, in one read.

Every fetched file is read once, after it is complete on disk: that pass computes the
sha256 the manifest records and, at the same time, whatever digest the source publishes
(S3: a full-object SHA-256 or CRC32 checksum, else the ETag's MD5, single- or multipart;
the Hub: the LFS sha256 or the git blob sha1).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ebb.errors import WeightsCorrupt
from ebb.weights_cache.manifest import FileEntry

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Expected:
    """What a source states about one file. Only `size_bytes` is always known."""

    size_bytes: int
    sha256_hex: str | None = None
    crc32: int | None = None
    md5_hex: str | None = None  # a single-part S3 ETag
    # A multipart S3 ETag: md5 of the parts' md5s, "-", part count; and the part size.
    multipart_etag: str | None = None
    multipart_part_bytes: int | None = None
    git_sha1_hex: str | None = None  # a Hub file stored in git (not LFS): its blob id

    @property
    def describes(self) -> str:
        """Which digest a check compares, for log lines."""
        for name in ("sha256_hex", "crc32", "md5_hex", "multipart_etag", "git_sha1_hex"):
            if getattr(self, name) is not None:
                return name.removesuffix("_hex")
        return "size only"


def b64_to_hex(value: str) -> str | None:
    """S3 sends checksums base64-encoded; None when `value` is not."""
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return None


class _MultipartMd5:
    """md5 of each `part_bytes` run of the stream, folded the way S3 builds its ETag."""

    def __init__(self, part_bytes: int):
        self.part_bytes = part_bytes
        self.parts: list[bytes] = []
        self.current = hashlib.md5()  # noqa: S324 - S3's ETag, not security
        self.filled = 0

    def update(self, data: memoryview) -> None:
        while data:
            take = min(len(data), self.part_bytes - self.filled)
            self.current.update(data[:take])
            self.filled += take
            data = data[take:]
            if self.filled == self.part_bytes:
                self._close_part()

    def _close_part(self) -> None:
        self.parts.append(self.current.digest())
        self.current = hashlib.md5()  # noqa: S324
        self.filled = 0

    def etag(self) -> str:
        if self.filled:
            self._close_part()
        combined = hashlib.md5(b"".join(self.parts)).hexdigest()  # noqa: S324
        return f"{combined}-{len(self.parts)}"


def digest_file(
    root: Path, name: str, expected: Expected, on_bytes: Callable[[int], None] | None = None
) -> tuple[FileEntry, str | None]:
    """Read `root/name` once: its FileEntry (with sha256) and the first disagreement with
    `expected`, described, or None. The file is fsynced, as it is about to be published."""
    sha256 = hashlib.sha256()
    crc = 0
    md5 = hashlib.md5() if expected.md5_hex else None  # noqa: S324
    multipart = (
        _MultipartMd5(expected.multipart_part_bytes)
        if expected.multipart_etag and expected.multipart_part_bytes
        else None
    )
    git = None
    if expected.git_sha1_hex:
        git = hashlib.sha1(f"blob {expected.size_bytes}\0".encode())  # noqa: S324 - git's id
    with open(root / name, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            view = memoryview(chunk)
            sha256.update(view)
            if expected.crc32 is not None:
                crc = zlib.crc32(view, crc)
            for digest in (md5, multipart, git):
                if digest is not None:
                    digest.update(view)
            if on_bytes is not None:
                on_bytes(len(chunk))
        os.fsync(f.fileno())
        stat = os.fstat(f.fileno())
    entry = FileEntry(name, stat.st_size, sha256.hexdigest(), stat.st_mtime_ns)
    actual = {
        "size": stat.st_size,
        "sha256": entry.sha256,
        "crc32": crc,
        "md5": md5.hexdigest() if md5 else None,
        "multipart_etag": multipart.etag() if multipart else None,
        "git_sha1": git.hexdigest() if git else None,
    }
    wanted = {
        "size": expected.size_bytes,
        "sha256": expected.sha256_hex,
        "crc32": expected.crc32,
        "md5": expected.md5_hex,
        "multipart_etag": expected.multipart_etag,
        "git_sha1": expected.git_sha1_hex,
    }
    for what, want in wanted.items():
        if want is not None and actual[what] != want:
            return entry, f"{name}: {what} is {actual[what]}, the source says {want}"
    return entry, None


def fetch_until_verified(fetch_round: Callable[[], list[str]], uri: str, hint: str) -> None:
    """Run `fetch_round` once more if it reports mismatches (it drops those files, so the
    next round fetches them again): bytes can be damaged in transit. A second mismatch is
    the source disagreeing with its own checksums: WeightsCorrupt, with `hint`."""
    problems = fetch_round()
    if not problems:
        return
    logger.warning("weights: refetching from %s: %s", uri, "; ".join(problems))
    problems = fetch_round()
    if problems:
        raise WeightsCorrupt(
            f"{uri}: fetched twice, and the bytes never matched what the source states for "
            f"them: {'; '.join(problems)}. {hint}"
        )
