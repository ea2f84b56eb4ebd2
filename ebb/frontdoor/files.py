"""Files of the Batch API (`purpose: "batch"` inputs, batch outputs and error files).

Stored in the object store when one is configured (EBB_FILES_S3_BUCKET: `S3FileStore`),
else on local disk under EBB_HOME (`LocalFileStore`); `file_store` picks. Either way a
file is its content under `<id>` plus `<id>.json`, its metadata (owner tenant, name,
purpose, size, creation and expiry time), the metadata written last so a file is seen
whole or not at all, and never changed once written; deleting removes the metadata first
(the file is gone for every reader at once), then the content. What each tenant holds
against its caps, and when each file expires, is kept in Redis (ebb.queue.file_quota).
Every method blocks (disk or boto3): callers on the event loop run them in a thread.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from ebb.config import Settings


@dataclass(frozen=True)
class FileInfo:
    file_id: str
    tenant: str
    filename: str
    purpose: str  # "batch" (an input) | "batch_output"
    bytes: int
    created_at_s: int
    # When the retention sweep deletes it (epoch s; None: files stored before retention).
    expires_at_s: int | None = None

    def view(self) -> dict[str, Any]:
        """OpenAI's file object."""
        return {
            "id": self.file_id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at_s,
            "expires_at": self.expires_at_s,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


class FileStore(Protocol):
    def put(
        self,
        content: bytes,
        *,
        tenant: str,
        filename: str,
        purpose: str,
        file_id: str = "",
        keep_s: int | None = None,
    ) -> FileInfo:
        """Store `content` (to expire `keep_s` after its creation); with a given `file_id`
        (outputs), writing it again is a no-op."""
        ...

    def delete(self, file_id: str) -> None:
        """Remove the file (metadata first); deleting a missing file is a no-op."""
        ...

    def info(self, file_id: str) -> FileInfo | None: ...

    def content(self, file_id: str) -> bytes: ...

    def list(self, tenant: str | None) -> list[FileInfo]:
        """Every file of `tenant` (all with None), newest first."""
        ...


def file_store(settings: Settings) -> FileStore:
    """The object store when EBB_FILES_S3_BUCKET is set, else EBB_HOME/files."""
    if settings.files_s3_bucket:
        return S3FileStore(
            settings.files_s3_bucket,
            settings.files_s3_prefix,
            endpoint_url=settings.files_s3_endpoint_url,
        )
    return LocalFileStore(settings.files_dir)


# What a file id may be (an allowlist: uploads' `file-<hex>` and outputs'
# `file-<batch id>-output`); anything else names no file, and is never a path on disk.
_FILE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


def _valid_id(file_id: str) -> bool:
    return _FILE_ID.fullmatch(file_id) is not None


def _newest_first(found: list[FileInfo]) -> list[FileInfo]:
    return sorted(found, key=lambda i: (i.created_at_s, i.file_id), reverse=True)


class LocalFileStore:
    def __init__(self, root: Path):
        self._root = root

    def put(
        self,
        content: bytes,
        *,
        tenant: str,
        filename: str,
        purpose: str,
        file_id: str = "",
        keep_s: int | None = None,
    ) -> FileInfo:
        """Store `content`; with a given `file_id` (outputs), writing it again is a no-op."""
        self._root.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = FileInfo(
            file_id=file_id or new_file_id(),
            tenant=tenant,
            filename=filename,
            purpose=purpose,
            bytes=len(content),
            created_at_s=(now := int(time.time())),
            expires_at_s=None if keep_s is None else now + keep_s,
        )
        if file_id and (existing := self.info(file_id)) is not None:
            return existing
        _write_atomically(self._root / info.file_id, content)
        # Metadata last: a file is listed only once its content is whole.
        _write_atomically(self._meta(info.file_id), json.dumps(asdict(info)).encode())
        return info

    def info(self, file_id: str) -> FileInfo | None:
        if not _valid_id(file_id):
            return None
        try:
            return FileInfo(**json.loads(self._meta(file_id).read_bytes()))
        except FileNotFoundError:
            return None

    def content(self, file_id: str) -> bytes:
        return (self._root / file_id).read_bytes()

    def delete(self, file_id: str) -> None:
        if not _valid_id(file_id):
            return
        self._meta(file_id).unlink(missing_ok=True)
        (self._root / file_id).unlink(missing_ok=True)

    def list(self, tenant: str | None) -> list[FileInfo]:
        """Every file of `tenant` (all with None), newest first."""
        if not self._root.exists():
            return []
        found = []
        for meta in self._root.glob("*.json"):
            info = self.info(meta.stem)
            if info is not None and (tenant is None or info.tenant == tenant):
                found.append(info)
        return _newest_first(found)

    def _meta(self, file_id: str) -> Path:
        return self._root / f"{file_id}.json"


def _write_atomically(path: Path, content: bytes) -> None:
    """A tenant's bytes, readable by the platform's user alone (mode 0600): data that no
    process is ever pointed at as configuration (a version's env names no file)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(content)
    os.replace(tmp, path)


class S3FileStore:
    """Files as objects `<prefix>/<id>` and `<prefix>/<id>.json` in one bucket. boto3 finds
    credentials the standard way (AWS_* variables, profiles, instance roles) and the
    endpoint in `endpoint_url` or AWS_ENDPOINT_URL(_S3); it is imported only here, so a
    frontdoor without an object store never loads it."""

    def __init__(self, bucket: str, prefix: str = "files", *, endpoint_url: str | None = None):
        import boto3

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._s3: Any = boto3.client("s3", endpoint_url=endpoint_url)

    def put(
        self,
        content: bytes,
        *,
        tenant: str,
        filename: str,
        purpose: str,
        file_id: str = "",
        keep_s: int | None = None,
    ) -> FileInfo:
        if file_id and (existing := self.info(file_id)) is not None:
            return existing
        info = FileInfo(
            file_id=file_id or new_file_id(),
            tenant=tenant,
            filename=filename,
            purpose=purpose,
            bytes=len(content),
            created_at_s=(now := int(time.time())),
            expires_at_s=None if keep_s is None else now + keep_s,
        )
        self._s3.put_object(Bucket=self.bucket, Key=self._key(info.file_id), Body=content)
        # Metadata last: a file is listed only once its content is whole.
        meta = json.dumps(asdict(info)).encode()
        self._s3.put_object(Bucket=self.bucket, Key=self._key(f"{info.file_id}.json"), Body=meta)
        return info

    def info(self, file_id: str) -> FileInfo | None:
        if not _valid_id(file_id):
            return None
        raw = self._get(f"{file_id}.json")
        return None if raw is None else FileInfo(**json.loads(raw))

    def content(self, file_id: str) -> bytes:
        raw = self._get(file_id)
        if raw is None:
            raise FileNotFoundError(f"s3://{self.bucket}/{self._key(file_id)}")
        return raw

    def delete(self, file_id: str) -> None:
        if not _valid_id(file_id):
            return
        # Deleting a missing key succeeds (S3's DeleteObject is idempotent).
        self._s3.delete_object(Bucket=self.bucket, Key=self._key(f"{file_id}.json"))
        self._s3.delete_object(Bucket=self.bucket, Key=self._key(file_id))

    def list(self, tenant: str | None) -> list[FileInfo]:
        found = []
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.prefix}/"
        )
        for page in pages:
            for obj in page.get("Contents", []):
                name = obj["Key"][len(self.prefix) + 1 :]
                if not name.endswith(".json") or "/" in name:
                    continue
                info = self.info(name.removesuffix(".json"))
                if info is not None and (tenant is None or info.tenant == tenant):
                    found.append(info)
        return _newest_first(found)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _get(self, name: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            reply = self._s3.get_object(Bucket=self.bucket, Key=self._key(name))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        return bytes(reply["Body"].read())
