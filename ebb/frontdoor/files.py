"""Files of the Batch API (`purpose: "batch"` inputs, batch outputs), on local disk.

A file is `EBB_HOME/files/<id>` plus `<id>.json`, its metadata (owner tenant, name,
purpose, size, creation time). Both are written to a temporary name and renamed, so a
reader sees a whole file or none; a file is never changed once written.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class FileInfo:
    file_id: str
    tenant: str
    filename: str
    purpose: str  # "batch" (an input) | "batch_output"
    bytes: int
    created_at_s: int

    def view(self) -> dict:
        """OpenAI's file object."""
        return {
            "id": self.file_id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at_s,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


class FileStore:
    def __init__(self, root: Path):
        self._root = root

    def put(
        self, content: bytes, *, tenant: str, filename: str, purpose: str, file_id: str = ""
    ) -> FileInfo:
        """Store `content`; with a given `file_id` (outputs), writing it again is a no-op."""
        self._root.mkdir(parents=True, exist_ok=True)
        info = FileInfo(
            file_id=file_id or new_file_id(),
            tenant=tenant,
            filename=filename,
            purpose=purpose,
            bytes=len(content),
            created_at_s=int(time.time()),
        )
        if file_id and (existing := self.info(file_id)) is not None:
            return existing
        _write_atomically(self._root / info.file_id, content)
        # Metadata last: a file is listed only once its content is whole.
        _write_atomically(self._meta(info.file_id), json.dumps(asdict(info)).encode())
        return info

    def info(self, file_id: str) -> FileInfo | None:
        if "/" in file_id or file_id.startswith("."):
            return None
        try:
            return FileInfo(**json.loads(self._meta(file_id).read_bytes()))
        except FileNotFoundError:
            return None

    def content(self, file_id: str) -> bytes:
        return (self._root / file_id).read_bytes()

    def list(self, tenant: str | None) -> list[FileInfo]:
        """Every file of `tenant` (all with None), newest first."""
        if not self._root.exists():
            return []
        found = []
        for meta in self._root.glob("*.json"):
            info = self.info(meta.stem)
            if info is not None and (tenant is None or info.tenant == tenant):
                found.append(info)
        return sorted(found, key=lambda i: (i.created_at_s, i.file_id), reverse=True)

    def _meta(self, file_id: str) -> Path:
        return self._root / f"{file_id}.json"


def _write_atomically(path: Path, content: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)
