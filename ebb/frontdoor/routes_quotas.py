"""Tenant quotas: what a tenant may deploy itself (set by the admin, read by it too)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from ebb.errors import PermissionDenied
from ebb.frontdoor.auth import AdminDep, CallerDep
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.quotas import footprints, use_of
from ebb.frontdoor.routes_deployments import MAX_SOURCE_CHARS
from ebb.frontdoor.routes_limits import TenantName
from ebb.frontdoor.services import Services, ServicesDep
from ebb.queue.quotas import DEFAULT_MAX_VERSIONS, TenantQuota
from ebb.queue.version_store import MAX_VERSIONS_KEPT

router = APIRouter(prefix="/v1/tenants")


class QuotaBody(BaseModel):
    """A tenant's whole quota (PUT replaces it; an absent field is 0 or none)."""

    model_config = ConfigDict(extra="forbid")

    max_deployments: int = Field(0, ge=0, le=10_000, description="Deployments it may own.")
    max_replicas: int = Field(
        0,
        ge=0,
        le=100_000,
        description="max_replicas summed over its deployments and their serving versions.",
    )
    max_gpus: int = Field(
        0,
        ge=0,
        le=100_000,
        description="max_replicas × tensor_parallel_size summed over its deployments and "
        "the versions of each that hold or may hold runners (both ends of a rollout).",
    )
    max_versions: int = Field(
        DEFAULT_MAX_VERSIONS,
        ge=1,
        le=MAX_VERSIONS_KEPT,
        description=f"Versions kept per deployment (at most {MAX_VERSIONS_KEPT}).",
    )
    allowed_sources: list[
        Annotated[str, StringConstraints(min_length=1, max_length=MAX_SOURCE_CHARS)]
    ] = Field(
        default_factory=list,
        max_length=64,
        description="Source prefixes it may deploy from; '*' allows any.",
    )


async def quota_view(services: Services, tenant: str, quota: TenantQuota | None) -> dict[str, Any]:
    holdings, _ = await services.quotas.holdings(tenant, "")
    use = use_of(footprints(tenant, holdings).values())
    return {
        "object": "tenant_quota",
        "tenant": tenant,
        **msgspec.structs.asdict(quota or TenantQuota()),
        "use": {"deployments": use.deployments, "replicas": use.replicas, "gpus": use.gpus},
    }


def _own_or_admin(caller: Caller, tenant: str) -> None:
    if not caller.is_admin and caller.tenant != tenant:
        raise PermissionDenied("A tenant key reads its own tenant's quota only.", param="tenant")


@router.get("/{tenant}/quota")
async def get_quota(tenant: TenantName, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    """The quota and what the tenant's deployments use of it (the admin, or the tenant)."""
    _own_or_admin(caller, tenant)
    return await quota_view(services, tenant, await services.quotas.get(tenant))


@router.put("/{tenant}/quota")
async def set_quota(
    tenant: TenantName, body: QuotaBody, caller: AdminDep, services: ServicesDep
) -> dict[str, Any]:
    """Replace the tenant's quota. Lowering it below what it uses removes nothing: the
    tenant may then only scale down or delete until it fits."""
    quota = TenantQuota(**body.model_dump())
    await services.quotas.set(tenant, quota)
    return await quota_view(services, tenant, quota)
