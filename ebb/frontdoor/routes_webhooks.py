"""The caller's webhook signing secret: read it, rotate it (/v1/webhooks/secret).

Every delivery to the tenant's webhooks is signed with its current secret; after a
rotation it is signed with the previous one too until the overlap ends, so receivers can
switch secrets without rejecting a single delivery. The admin may name a tenant
(`?tenant=`) to read or rotate that tenant's secret.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from ebb.errors import PermissionDenied
from ebb.frontdoor.auth import CallerDep
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.routes_limits import TENANT_PATTERN
from ebb.frontdoor.services import ServicesDep
from ebb.queue.webhook_secrets import SecretSet
from ebb.webhooks.signing import new_secret

router = APIRouter(prefix="/v1/webhooks")

_MAX_OVERLAP_S = 7 * 86400


class Rotation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    overlap_s: float | None = Field(
        None, ge=0, le=_MAX_OVERLAP_S, description="How long the old secret stays valid."
    )


def _secret_view(tenant: str, secrets: SecretSet) -> dict[str, Any]:
    return {
        "object": "webhook_secret",
        "tenant": tenant,
        "secret": secrets.current,
        "rotated_at": secrets.rotated_ms / 1000 if secrets.rotated_ms else None,
        "previous_secret_expires_at": (
            secrets.previous_until_ms / 1000 if secrets.previous else None
        ),
    }


def _whose(caller: Caller, tenant: str | None) -> str:
    """The caller's own tenant, or (the admin only) the one it names."""
    if tenant is None or tenant == caller.tenant:
        return caller.tenant
    if not caller.is_admin:
        raise PermissionDenied(
            "A tenant key reads and rotates its own secret only; leave tenant out.",
            param="tenant",
        )
    return tenant


TenantQuery = Annotated[str | None, Query(pattern=TENANT_PATTERN)]


@router.get("/secret")
async def get_secret(
    caller: CallerDep, services: ServicesDep, tenant: TenantQuery = None
) -> dict[str, Any]:
    whose = _whose(caller, tenant)
    secrets = await services.webhook_secrets.ensure(whose, new_secret())
    return _secret_view(whose, secrets)


@router.post("/secret/rotate")
async def rotate_secret(
    caller: CallerDep,
    services: ServicesDep,
    body: Rotation | None = None,
    tenant: TenantQuery = None,
) -> dict[str, Any]:
    whose = _whose(caller, tenant)
    overlap_s = services.settings.webhook_secret_overlap_s
    if body is not None and body.overlap_s is not None:
        overlap_s = body.overlap_s
    secrets = await services.webhook_secrets.rotate(whose, new_secret(), overlap_s)
    return _secret_view(whose, secrets)
