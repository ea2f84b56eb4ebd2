"""The room a new stored response takes under its tenant's caps, taken before it runs.

A stored response (`store`, the default) is refused before any work is done when Redis is
nearly full (503 `storage_full`, `tenant_writes`) or when its tenant already keeps
EBB_RESPONSES_MAX_PER_TENANT responses or EBB_RESPONSES_MAX_TENANT_BYTES bytes of them
(403 `quota_exceeded`: waiting does not help, deleting responses or `store: false` does).
"""

from __future__ import annotations

import msgspec

from ebb.errors import QuotaExceeded
from ebb.frontdoor.services import Services
from ebb.frontdoor.tenant_writes import require_tenant_write_room
from ebb.queue.response_store import ResponseStore, StoredResponse


async def hold_room(services: Services, store: ResponseStore, record: StoredResponse) -> None:
    """Take room for `record` (its size as now, before its output); raise when none."""
    await require_tenant_write_room(services, "stored responses")
    response_id = record.response["id"]
    size_bytes = len(msgspec.json.encode(record))
    held = await store.reserve(record.tenant, response_id, size_bytes=size_bytes)
    if held is None:
        return
    raise QuotaExceeded(
        f"This key's tenant keeps {held.count} stored responses ({held.size_bytes} bytes); "
        f"the most it may keep is {store.max_count} responses and {store.max_bytes} bytes, "
        f"and this one ({size_bytes} bytes) would pass that. Delete stored responses you no "
        "longer need (DELETE /v1/responses/{id}), or send store: false to answer without "
        "storing.",
        param="store",
    )
