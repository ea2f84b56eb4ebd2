"""API keys (admin), health, readiness and metrics."""

from __future__ import annotations

import hmac
import secrets
import time
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, field_validator

from ebb.errors import Conflict, NotFound
from ebb.frontdoor import tenancy
from ebb.frontdoor.auth import AdminDep, authenticate, require_admin
from ebb.frontdoor.caller import ADMIN_TENANT
from ebb.frontdoor.routes_limits import TENANT_PATTERN, RateLimitsBody
from ebb.frontdoor.services import ServicesDep
from ebb.home import new_secret
from ebb.queue.ratelimits import RateLimits, key_subject
from ebb.queue.schema import ApiKeyRecord

router = APIRouter()

KEY_PREFIX = "ebb-sk-"


# Random characters of the secret kept in the clear after KEY_PREFIX, so that a key's
# holder can find it in listings (36 bits of its 256).
SHOWN_SECRET_CHARS = 6


class KeyCreate(RateLimitsBody):
    tenant: str = Field(min_length=1, max_length=64, pattern=TENANT_PATTERN)
    name: str = Field("", max_length=128)

    @field_validator("tenant")
    @classmethod
    def _not_the_admins(cls, tenant: str) -> str:
        # The admin key's own tenant owns the platform's deployments: a key of it would
        # manage them all (see tenancy).
        if tenant == ADMIN_TENANT:
            raise ValueError(f"{ADMIN_TENANT!r} is the admin key's own tenant; pick another name")
        return tenant


def _key_view(record: ApiKeyRecord, limits: RateLimits | None = None) -> dict[str, Any]:
    return {
        "object": "api_key",
        "id": record.key_id,
        "prefix": record.prefix,
        "tenant": record.tenant,
        "name": record.name,
        "created": int(record.created_at_s),
        "revoked": record.revoked,
        "limits": msgspec.structs.asdict(limits or RateLimits()),
    }


def _matches(record: ApiKeyRecord, prefix: str | None, tenant: str | None) -> bool:
    if tenant is not None and record.tenant != tenant:
        return False
    if not prefix:
        return True
    # A prefix of the id or of the shown secret, or a longer piece of the secret pasted in.
    shown = record.prefix
    return record.key_id.startswith(prefix) or (
        bool(shown) and (shown.startswith(prefix) or prefix.startswith(shown))
    )


@router.post("/v1/keys", status_code=201)
async def create_key(body: KeyCreate, caller: AdminDep, services: ServicesDep) -> dict[str, Any]:
    tenants = {r.tenant for r in await services.state.list_api_keys()}
    clash = tenancy.namespace_clash(body.tenant, tenants)
    if clash is not None:
        raise Conflict(
            f"Tenant {body.tenant!r} would share deployment names with tenant {clash!r} "
            f"(a tenant names its deployments '<tenant>-...', lowercased): pick a tenant name "
            f"that neither starts with {tenancy.namespace(clash)!r} nor is a prefix of it.",
            param="tenant",
        )
    secret = new_secret(KEY_PREFIX)
    # The id is a random public handle, not a slice of the secret: listing keys must
    # reveal nothing of them.
    record = ApiKeyRecord(
        key_id="key_" + secrets.token_hex(6),
        tenant=body.tenant,
        name=body.name,
        created_at_s=time.time(),
        prefix=secret[: len(KEY_PREFIX) + SHOWN_SECRET_CHARS],
    )
    limits = body.limits()
    if limits != RateLimits():
        await services.ratelimits.set_limits(key_subject(record.key_id), limits)
    await services.state.create_api_key(secret, record)
    return {**_key_view(record, limits), "key": secret}


@router.get("/v1/keys")
async def list_keys(
    caller: AdminDep,
    services: ServicesDep,
    prefix: str | None = None,
    tenant: str | None = None,
) -> dict[str, Any]:
    """Keys, optionally those whose id or shown secret starts with `prefix`, or a tenant's."""
    records = await services.state.list_api_keys()
    limits = await services.ratelimits.all_limits()
    return {
        "object": "list",
        "data": [
            _key_view(r, limits.get(key_subject(r.key_id)))
            for r in records
            if _matches(r, prefix, tenant)
        ],
    }


@router.delete("/v1/keys/{key_id}")
async def revoke_key(key_id: str, caller: AdminDep, services: ServicesDep) -> dict[str, Any]:
    if not await services.state.revoke_api_key(key_id):
        raise NotFound(f"No active key with id {key_id!r}. 'ebb keys list' shows them.")
    return {"object": "api_key", "id": key_id, "revoked": True}


@router.get("/healthz")
@router.get("/health")  # the path vLLM's server answers, which its tooling probes
async def healthz() -> dict[str, Any]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(services: ServicesDep) -> Response:
    try:
        await services.state.ping()
    except Exception as e:
        return JSONResponse({"status": "unavailable", "redis": str(e)}, status_code=503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics")
async def metrics(request: Request, services: ServicesDep) -> Response:
    """Prometheus text; needs EBB_METRICS_TOKEN or the admin key as a bearer token."""
    token = services.settings.metrics_token
    presented = request.headers.get("authorization", "").partition(" ")[2].strip()
    if not (token and hmac.compare_digest(presented.encode(), token.encode())):
        await require_admin(await authenticate(request, services))
    body = await services.metrics.render(services.state)
    return Response(body, media_type="text/plain; version=0.0.4")
