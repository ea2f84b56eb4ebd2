"""The Files API as the Batch API needs it: upload a JSONL input, list, read back (from
the object store or EBB_HOME, see ebb.frontdoor.files)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, UploadFile
from fastapi.responses import Response

from ebb.errors import InvalidRequest, NotFound
from ebb.frontdoor.auth import CallerDep
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.files import FileInfo, FileStore
from ebb.frontdoor.services import ServicesDep

router = APIRouter(prefix="/v1/files")

_READ_CHUNK_BYTES = 1 << 20


@router.post("")
async def upload_file(
    caller: CallerDep,
    services: ServicesDep,
    file: Annotated[UploadFile, File()],
    purpose: Annotated[str, Form()],
) -> dict[str, Any]:
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
    info = await asyncio.to_thread(
        services.files.put,
        bytes(content),
        tenant=caller.tenant,
        filename=file.filename or "batch.jsonl",
        purpose=purpose,
    )
    return info.view()


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


async def owned_file(files: FileStore, file_id: str, caller: Caller) -> FileInfo:
    info = await asyncio.to_thread(files.info, file_id)
    if info is None or (info.tenant != caller.tenant and not caller.is_admin):
        raise NotFound(f"No file {file_id!r}. GET /v1/files lists yours.", param="file_id")
    return info
