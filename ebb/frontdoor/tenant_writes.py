"""The refusal of a new tenant-fed write while Redis is nearly full.

Every store a tenant fills (stored responses, stream views, files, batches, jobs) calls
`require_tenant_write_room` before it writes: past the high-water mark of Redis's
`maxmemory` (EBB_REDIS_TENANT_WRITE_HIGH_WATER) the write is refused with a 503
`storage_full`, before Redis's own limit refuses the platform's writes.
"""

from __future__ import annotations

from ebb.errors import CapacityError
from ebb.frontdoor.services import Services

# Memory comes back as records expire or are deleted: minutes, not seconds.
RETRY_AFTER_S = 60.0


async def require_tenant_write_room(services: Services, what: str) -> None:
    """Raise a 503 (`storage_full`) naming `what` (e.g. "stored responses") once Redis's
    memory passed the high-water mark; return at once otherwise (cached reading)."""
    if await services.headroom.tenant_write_allowed():
        return
    raise CapacityError(
        f"The platform's store is nearly full, so no new {what} are taken now. Retry "
        "later; a request that stores nothing (not streamed, and store: false on "
        "/v1/responses) still answers. Operators: see docs/FAILURES.md (Redis memory).",
        retry_after_s=RETRY_AFTER_S,
        code="storage_full",
    )
