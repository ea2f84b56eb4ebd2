"""Bearer-key authentication: the admin key, or a tenant's API key (hashed at rest)."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from ebb.errors import AuthenticationFailed, PermissionDenied
from ebb.frontdoor.caller import ADMIN_TENANT, Caller
from ebb.frontdoor.redis_down import ride_out
from ebb.frontdoor.services import Services, ServicesDep, services_of


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationFailed(
            "Missing API key. Send it as an HTTP header: 'Authorization: Bearer YOUR_KEY'.",
            code="missing_api_key",
        )
    return token.strip()


async def authenticate(request: Request, services: ServicesDep) -> Caller:
    token = _bearer(request)
    if hmac.compare_digest(token.encode(), services.admin_key.encode()):
        return Caller(tenant=ADMIN_TENANT, key_id="admin", is_admin=True)
    record = await services.state.lookup_api_key(token)
    if record is None or record.revoked:
        raise AuthenticationFailed(
            "Incorrect or revoked API key. Create one with 'ebb keys create' "
            "or in the console's Keys view."
        )
    return Caller(tenant=record.tenant, key_id=record.key_id, is_admin=False)


async def calling(request: Request) -> tuple[Services, Caller]:
    """The services and the authenticated caller, for the inference routes: resolving them
    as two FastAPI dependencies cost a tenth of the frontdoor's CPU on a request refused
    for a full queue, the request that must be answered fastest."""
    services = services_of(request)
    return services, await authenticate(request, services)


async def require_admin(caller: Annotated[Caller, Depends(authenticate)]) -> Caller:
    if not caller.is_admin:
        raise PermissionDenied("This endpoint needs the admin key.")
    return caller


async def authenticate_riding_out(request: Request, services: ServicesDep) -> Caller:
    """`authenticate`, waiting out a short Redis outage (routes accepting async work)."""
    return await ride_out(lambda: authenticate(request, services), services.settings.redis_outage_s)


CallerDep = Annotated[Caller, Depends(authenticate)]
RidingCallerDep = Annotated[Caller, Depends(authenticate_riding_out)]
AdminDep = Annotated[Caller, Depends(require_admin)]
