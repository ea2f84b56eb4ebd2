"""What a cache entry holds: the manifest (files, sizes, sha256) and the HF-layout checks.

A manifest is written once, when an entry is published, and read on every `ensure()`.
The cheap check (`missing_or_resized`) compares sizes only; `mismatched` re-hashes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ebb.errors import WeightsError

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
SEAL_NAME = "seal.json"
ACCESS_NAME = "last_access"
# The store's own files beside a model's: never part of a model, wherever they turn up
# (an entry synced to S3 as it is, a local source pointed at an entry).
BOOKKEEPING_NAMES = (MANIFEST_NAME, SEAL_NAME, ACCESS_NAME)
MANIFEST_FORMAT = 1
_HASH_CHUNK_BYTES = 8 * 1024 * 1024
# Weight formats vLLM ignores when safetensors are present (e.g. Meta's original/*.pth
# beside the HF checkpoint): hashing them would cost minutes and protect nothing.
_IGNORED_SUFFIXES = (".bin", ".pth", ".pt", ".gguf", ".h5", ".msgpack", ".onnx", ".ckpt")
# Config keys that carry the context length, in the order models use them.
_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
)

Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the model root, POSIX separators
    size_bytes: int
    sha256: str
    mtime_ns: int = 0  # only meaningful for in-place entries, whose files we do not own


@dataclass(frozen=True)
class Manifest:
    source: str
    key: str
    files: tuple[FileEntry, ...]
    created_at: str
    fingerprint: str = ""
    # Set for sources used in place (a local directory): the files live there, not here.
    root: str | None = None
    format: int = MANIFEST_FORMAT
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        return sum(entry.size_bytes for entry in self.files)

    def to_json(self) -> str:
        body = asdict(self)
        body["files"] = [asdict(entry) for entry in self.files]
        return json.dumps(body, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        body = json.loads(text)
        if not isinstance(body, dict) or body.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"unsupported manifest format {body.get('format')!r}")
        files = tuple(FileEntry(**entry) for entry in body.pop("files"))
        return cls(files=files, **body)


def read_manifest(entry_dir: Path) -> Manifest | None:
    """The entry's manifest, or None when it is missing or unreadable (a broken entry)."""
    try:
        return Manifest.from_json((entry_dir / MANIFEST_NAME).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as e:
        logger.warning("weights: unreadable manifest in %s: %s", entry_dir, e)
        return None


def write_manifest(entry_dir: Path, manifest: Manifest) -> None:
    """Write the manifest durably; `entry_dir` is not visible to readers yet, or the
    write goes through a temporary file and an atomic replace."""
    tmp = entry_dir / f".{MANIFEST_NAME}.tmp"
    with open(tmp, "w") as f:
        f.write(manifest.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, entry_dir / MANIFEST_NAME)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def model_files(root: Path, *, exclude: Iterable[str] = ()) -> list[str]:
    """The files that make up the model under `root`, relative and sorted.

    Top level only, no hidden files and none of the store's bookkeeping: HF checkpoints
    are flat, and a `.git` or `.cache` folder beside them is not part of the model.
    """
    skipped = {*exclude, *BOOKKEEPING_NAMES}
    names = []
    for child in root.iterdir():
        if child.name.startswith(".") or child.name in skipped or not child.is_file():
            continue
        if child.name.lower().endswith(_IGNORED_SUFFIXES):
            continue
        names.append(child.name)
    return sorted(names)


def hash_files(
    root: Path,
    names: list[str],
    progress: Progress | None,
    *,
    phase: str = "hash",
    durable: bool = False,
) -> tuple[FileEntry, ...]:
    """FileEntry for each name, reading everything once. With `durable`, each file is also
    fsynced as it is read, so an entry about to be published survives a power cut (files
    used in place are not ours to sync, and may sit on a read-only mount)."""
    total = sum((root / name).stat().st_size for name in names) or 1
    done = 0
    entries = []
    _report(progress, phase, 0.0)
    for name in names:
        path = root / name
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_HASH_CHUNK_BYTES):
                digest.update(chunk)
                done += len(chunk)
                _report(progress, phase, min(done / total, 1.0))
            if durable:
                os.fsync(f.fileno())
            stat = os.fstat(f.fileno())
        entries.append(FileEntry(name, stat.st_size, digest.hexdigest(), stat.st_mtime_ns))
    _report(progress, phase, 1.0)
    return tuple(entries)


def missing_or_resized(root: Path, manifest: Manifest, *, check_mtime: bool) -> str | None:
    """The first file that is missing or changed size (or mtime, for in-place entries)."""
    for entry in manifest.files:
        try:
            stat = (root / entry.path).stat()
        except OSError:
            return f"{entry.path} is missing"
        if stat.st_size != entry.size_bytes:
            return f"{entry.path} is {stat.st_size} bytes, expected {entry.size_bytes}"
        if check_mtime and stat.st_mtime_ns != entry.mtime_ns:
            return f"{entry.path} was modified"
    return None


def mismatched(root: Path, manifest: Manifest, progress: Progress | None) -> str | None:
    """Re-hash every file; the first mismatch, described, or None when all match."""
    resized = missing_or_resized(root, manifest, check_mtime=False)
    if resized is not None:
        return resized
    names = [entry.path for entry in manifest.files]
    actual = hash_files(root, names, progress, phase="verify")
    for want, got in zip(manifest.files, actual, strict=True):
        if want.sha256 != got.sha256:
            return f"{want.path} has sha256 {got.sha256[:12]}..., expected {want.sha256[:12]}..."
    return None


def read_config(root: Path) -> dict[str, Any]:
    """config.json as a dict; WeightsError when it is absent or not a JSON object."""
    try:
        config = json.loads((root / "config.json").read_text())
    except FileNotFoundError as e:
        raise WeightsError(f"{root} has no config.json; it is not a Hugging Face model") from e
    except (OSError, ValueError) as e:
        raise WeightsError(f"{root}/config.json is unreadable: {e}") from e
    if not isinstance(config, dict):
        raise WeightsError(f"{root}/config.json is not a JSON object")
    return config


def max_model_len(config: dict[str, Any], root: Path) -> int:
    """The context length the checkpoint was trained for (multimodal configs nest it)."""
    for scope in (config, config.get("text_config") or {}):
        for key in _CONTEXT_KEYS:
            value = scope.get(key)
            if isinstance(value, int) and value > 0:
                return value
    raise WeightsError(
        f"{root}/config.json states no context length (looked for {', '.join(_CONTEXT_KEYS)})"
    )


def check_hf_layout(root: Path) -> dict[str, Any]:
    """Refuse a directory vLLM could not load; return its config."""
    config = read_config(root)
    shards = sorted(p.name for p in root.glob("*.safetensors"))
    if not shards:
        raise WeightsError(f"{root} has no *.safetensors file; only safetensors are served")
    index_path = root / "model.safetensors.index.json"
    if index_path.exists():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise WeightsError(f"{index_path} is unreadable: {e}") from e
        missing = sorted(set(weight_map.values()) - set(shards))
        if missing:
            raise WeightsError(f"{root} lacks shards named in its index: {', '.join(missing)}")
    if not (root / "tokenizer.json").exists() and not (root / "tokenizer_config.json").exists():
        logger.warning("weights: %s has no tokenizer files; chat requests will fail", root)
    return config


def _report(progress: Progress | None, phase: str, fraction: float) -> None:
    if progress is not None:
        progress(phase, fraction)
