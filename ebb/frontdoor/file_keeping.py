"""Storing, deleting and expiring tenants' files within their caps.

A file's share of its tenant's caps (count and bytes, EBB_FILES_MAX_PER_TENANT and
EBB_FILES_MAX_BYTES_PER_TENANT) is reserved in Redis before its content is written and
given back if writing fails, so two uploads at the edge cannot both pass. Every file
expires EBB_FILES_RETENTION_S after it was created (an upload's `expires_after` may ask
for sooner); `sweep_expired_files`, a loop of every frontdoor, deletes what is due.
Deleting removes the content first and gives the share back last: a deleter that dies in
between leaves the file due, and the sweep finishes it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ebb.errors import QuotaExceeded
from ebb.frontdoor.files import FileInfo, new_file_id
from ebb.frontdoor.services import Services
from ebb.frontdoor.tenant_writes import require_tenant_write_room

log = logging.getLogger(__name__)

# Files the sweep deletes per look (the rest wait for the next one).
_SWEEP_BATCH = 100


async def store_file(
    services: Services,
    content: bytes,
    *,
    tenant: str,
    filename: str,
    purpose: str,
    keep_s: int | None = None,
    file_id: str = "",
    platform_written: bool = False,
) -> FileInfo:
    """Store `content` as `tenant`'s file for `keep_s` (the retention when None).

    `platform_written` (a batch's output and error files) counts against the caps but is
    never refused: the tenant's work must be able to finish. Raises QuotaExceeded, naming
    the cap and what to delete, when an upload would pass one."""
    if not platform_written:  # a batch's own output must land, as the caps let it
        await require_tenant_write_room(services, "files")
    settings = services.settings
    keep_s = settings.files_retention_s if keep_s is None else keep_s
    file_id = file_id or new_file_id()
    expires_at_s = int(time.time()) + keep_s
    holdings = await services.file_quota.reserve(
        tenant,
        file_id,
        size_bytes=len(content),
        max_files=settings.files_max_per_tenant,
        max_bytes=settings.files_max_bytes_per_tenant,
        expires_at_s=expires_at_s,
        force=platform_written,
    )
    if holdings.refused_by:
        raise _over_cap(services, holdings.refused_by, holdings.files, holdings.bytes, content)
    try:
        return await asyncio.to_thread(
            services.files.put,
            content,
            tenant=tenant,
            filename=filename,
            purpose=purpose,
            file_id=file_id,
            keep_s=keep_s,
        )
    except BaseException:
        await services.file_quota.release(tenant, file_id)
        raise


def _over_cap(
    services: Services, cap: str, files: int, held_bytes: int, content: bytes
) -> QuotaExceeded:
    settings = services.settings
    if cap == "count":
        said = (
            f"You store {files} files, the most a tenant may keep "
            f"({settings.files_max_per_tenant}, EBB_FILES_MAX_PER_TENANT)."
        )
    else:
        said = (
            f"Your files hold {held_bytes} bytes; this one's {len(content)} would pass the "
            f"{settings.files_max_bytes_per_tenant} a tenant may keep "
            "(EBB_FILES_MAX_BYTES_PER_TENANT)."
        )
    return QuotaExceeded(
        f"{said} Delete files you no longer need (DELETE /v1/files/{{file_id}}; GET "
        "/v1/files lists them), then upload again.",
        param="file",
    )


async def delete_file(services: Services, info: FileInfo) -> None:
    """Delete `info`'s file and give back its share of its tenant's caps."""
    await services.file_quota.expire_now(info.tenant, info.file_id)
    await asyncio.to_thread(services.files.delete, info.file_id)
    await services.file_quota.release(info.tenant, info.file_id)


async def sweep_once(services: Services) -> int:
    """Delete the files whose retention ended; how many were."""
    swept = 0
    for due in await services.file_quota.due(time.time(), count=_SWEEP_BATCH):
        await asyncio.to_thread(services.files.delete, due.file_id)
        if await services.file_quota.release(due.tenant, due.file_id):
            swept += 1
    return swept


async def sweep_expired_files(services: Services, *, interval_s: float) -> None:
    """`sweep_once` every `interval_s`, until cancelled (every frontdoor runs it: deleting
    twice is harmless, a share is given back once)."""
    while True:
        try:
            swept = await sweep_once(services)
            if swept:
                log.info("files: %d expired file(s) deleted", swept)
        except Exception:  # Redis restarting, the object store down: the next look retries
            log.exception("files: the retention sweep failed; trying again")
        await asyncio.sleep(interval_s)
