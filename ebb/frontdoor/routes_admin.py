"""API keys (admin), health, readiness and metrics."""

from __future__ import annotations

import secrets
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from ebb.errors import NotFound
from ebb.frontdoor.auth import AdminDep
from ebb.home import new_secret
from ebb.queue.schema import ApiKeyRecord

router = APIRouter()

KEY_PREFIX = "ebb-sk-"


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    name: str = Field("", max_length=128)


def _key_view(record: ApiKeyRecord) -> dict:
    return {
        "object": "api_key",
        "id": record.key_id,
        "tenant": record.tenant,
        "name": record.name,
        "created": int(record.created_at_s),
        "revoked": record.revoked,
    }


@router.post("/v1/keys", status_code=201)
async def create_key(request: Request, body: KeyCreate, caller: AdminDep) -> dict:
    secret = new_secret(KEY_PREFIX)
    # The id is a random public handle, not a slice of the secret: listing keys must
    # reveal nothing of them.
    record = ApiKeyRecord(
        key_id="key_" + secrets.token_hex(6),
        tenant=body.tenant,
        name=body.name,
        created_at_s=time.time(),
    )
    await request.app.state.services.state.create_api_key(secret, record)
    return {**_key_view(record), "key": secret}


@router.get("/v1/keys")
async def list_keys(request: Request, caller: AdminDep) -> dict:
    records = await request.app.state.services.state.list_api_keys()
    return {"object": "list", "data": [_key_view(r) for r in records]}


@router.delete("/v1/keys/{key_id}")
async def revoke_key(request: Request, key_id: str, caller: AdminDep) -> dict:
    if not await request.app.state.services.state.revoke_api_key(key_id):
        raise NotFound(f"No active key with id {key_id!r}. 'ebb keys list' shows them.")
    return {"object": "api_key", "id": key_id, "revoked": True}


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    try:
        await request.app.state.services.state.ping()
    except Exception as e:
        return JSONResponse({"status": "unavailable", "redis": str(e)}, status_code=503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    services = request.app.state.services
    body = await services.metrics.render(services.state)
    return Response(body, media_type="text/plain; version=0.0.4")
