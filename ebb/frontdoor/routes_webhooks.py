"""The caller's webhook signing secret: read it, rotate it (/v1/webhooks/secret).

Every delivery to the tenant's webhooks is signed with its current secret; after a
rotation it is signed with the previous one too until the overlap ends, so receivers can
switch secrets without rejecting a single delivery.
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from ebb.frontdoor.auth import CallerDep
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


def _secret_view(tenant: str, secrets: SecretSet) -> dict:
    return {
        "object": "webhook_secret",
        "tenant": tenant,
        "secret": secrets.current,
        "rotated_at": secrets.rotated_ms / 1000 if secrets.rotated_ms else None,
        "previous_secret_expires_at": (
            secrets.previous_until_ms / 1000 if secrets.previous else None
        ),
    }


@router.get("/secret")
async def get_secret(caller: CallerDep, services: ServicesDep) -> dict:
    secrets = await services.webhook_secrets.ensure(caller.tenant, new_secret())
    return _secret_view(caller.tenant, secrets)


@router.post("/secret/rotate")
async def rotate_secret(
    caller: CallerDep, services: ServicesDep, body: Rotation | None = None
) -> dict:
    overlap_s = services.settings.webhook_secret_overlap_s
    if body is not None and body.overlap_s is not None:
        overlap_s = body.overlap_s
    secrets = await services.webhook_secrets.rotate(caller.tenant, new_secret(), overlap_s)
    return _secret_view(caller.tenant, secrets)
