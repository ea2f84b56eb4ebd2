"""The Files API as the Batch API needs it: upload a JSONL input, list, read back, delete
(from the object store or EBB_HOME, see ebb.frontdoor.files), each tenant within its caps
and every file for a retention (ebb.frontdoor.file_keeping)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, UploadFile
from fastapi.responses import Response

from ebb.errors import InvalidRequest, NotFound
from ebb.frontdoor.auth import CallerDep
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.file_keeping import delete_file, store_file
from ebb.frontdoor.files import FileInfo, FileStore
from ebb.frontdoor.services import Services, ServicesDep

router = APIRouter(prefix="/v1/files")

_READ_CHUNK_BYTES = 1 << 20


@router.post("")
async def upload_file(
    caller: CallerDep,
    services: ServicesDep,
    file: Annotated[UploadFile, File()],
    purpose: Annotated[str, Form()],
    expires_after_anchor: Annotated[str | None, Form(alias="expires_after[anchor]")] = None,
    expires_after_seconds: Annotated[str | None, Form(alias="expires_after[seconds]")] = None,
) -> dict[str, Any]:
    keep_s = _expires_after(services, expires_after_anchor, expires_after_seconds)
    if purpose != "batch":
        raise InvalidRequest(
            f'purpose must be "batch" (the only use of files here); got {purpose!r}.',
            param="purpose",
        )
    limit = services.settings.batch_file_max_bytes
    content = bytearray()
    while chunk := await file.read(_READ_CHUNK_BYTES):
        content += chunk
        if len(content) > limit:
            raise InvalidRequest(
                f"The file is larger than {limit} bytes (EBB_BATCH_FILE_MAX_BYTES); split "
                "it into several batches.",
                param="file",
            )
    if not content.strip():
        raise InvalidRequest("The file is empty; send one JSON request per line.", param="file")
    info = await store_file(
        services,
        bytes(content),
        tenant=caller.tenant,
        filename=file.filename or "batch.jsonl",
        purpose=purpose,
        keep_s=keep_s,
    )
    return info.view()


# OpenAI's bounds on `expires_after[seconds]` (one hour to 30 days).
_MIN_KEEP_S = 3600


def _expires_after(services: Services, anchor: str | None, seconds: str | None) -> int | None:
    """OpenAI's `expires_after` ({anchor: "created_at", seconds}) as the seconds to keep
    the file (None: the retention, EBB_FILES_RETENTION_S, which also bounds it)."""
    if anchor is None and seconds is None:
        return None
    most = services.settings.files_retention_s
    least = min(_MIN_KEEP_S, most)
    if anchor != "created_at":
        raise InvalidRequest(
            'expires_after[anchor] must be "created_at".', param="expires_after.anchor"
        )
    text = seconds or ""
    if not (text.isascii() and text.isdigit() and len(text) <= 12) or not (
        least <= int(text) <= most
    ):
        raise InvalidRequest(
            f"expires_after[seconds] must be a whole number of seconds from {least} to "
            f"{most} (EBB_FILES_RETENTION_S); got {text[:40]!r}.",
            param="expires_after.seconds",
        )
    return int(text)


@router.get("")
async def list_files(caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    tenant = None if caller.is_admin else caller.tenant
    found = await asyncio.to_thread(services.files.list, tenant)
    return {"object": "list", "data": [i.view() for i in found], "has_more": False}


@router.get("/{file_id}")
async def retrieve_file(file_id: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    return (await owned_file(services.files, file_id, caller)).view()


@router.get("/{file_id}/content")
async def file_content(file_id: str, caller: CallerDep, services: ServicesDep) -> Response:
    await owned_file(services.files, file_id, caller)
    content = await asyncio.to_thread(services.files.content, file_id)
    return Response(content, media_type="application/jsonl")


@router.delete("/{file_id}")
async def remove_file(file_id: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    """Delete a file (its owner or the admin) and free its share of the owner's caps. A
    batch reading it keeps the lines it has queued; lines not queued yet fail with
    `input_file_missing` (see docs/JOBS.md)."""
    info = await owned_file(services.files, file_id, caller)
    await delete_file(services, info)
    return {"id": info.file_id, "object": "file", "deleted": True}


async def owned_file(files: FileStore, file_id: str, caller: Caller) -> FileInfo:
    info = await asyncio.to_thread(files.info, file_id)
    if info is None or (info.tenant != caller.tenant and not caller.is_admin):
        raise NotFound(f"No file {file_id!r}. GET /v1/files lists yours.", param="file_id")
    return info
