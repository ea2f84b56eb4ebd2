"""Tenants and their rate limits, and the limits of single API keys (admin key)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from ebb.errors import NotFound
from ebb.frontdoor.auth import AdminDep
from ebb.frontdoor.routes_budgets import (
    BudgetFields,
    TenantFields,
    apply_budget,
    apply_tenant_settings,
    budget_view,
    tenant_settings_view,
)
from ebb.frontdoor.services import ServicesDep
from ebb.queue.priority import Priority
from ebb.queue.ratelimits import RateLimits, key_subject, tenant_subject

router = APIRouter(prefix="/v1")

# Tenant names end up in Redis field names and S3 lines: no separators, no spaces.
TENANT_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
TenantName = Annotated[str, Path(pattern=TENANT_PATTERN)]


class RateLimitsBody(BudgetFields, BaseModel):
    """Limits per minute; null (or absent) means unlimited. `budget`: routes_budgets."""

    model_config = ConfigDict(extra="forbid")

    requests_per_minute: int | None = Field(None, ge=1, le=10_000_000)
    tokens_per_minute: int | None = Field(None, ge=1, le=10_000_000_000)
    # Who waits under saturation (ebb.queue.priority); null: a key inherits its tenant's,
    # a tenant is standard.
    priority: Priority | None = None

    def limits(self) -> RateLimits:
        return RateLimits(
            requests_per_minute=self.requests_per_minute,
            tokens_per_minute=self.tokens_per_minute,
        )


class TenantLimitsBody(RateLimitsBody, TenantFields):
    """A tenant's limits, and its budget and webhook URL (routes_budgets)."""


def _limits_view(subject_kind: str, name: str, limits: RateLimits) -> dict[str, Any]:
    return {"object": "rate_limits", subject_kind: name, **msgspec.structs.asdict(limits)}


@router.get("/tenants")
async def list_tenants(caller: AdminDep, services: ServicesDep) -> dict[str, Any]:
    """Every tenant that has keys or limits, with its active keys and limits."""
    active: dict[str, int] = {}
    for record in await services.state.list_api_keys():
        active[record.tenant] = active.get(record.tenant, 0) + (not record.revoked)
    limits = await services.ratelimits.all_limits()
    for subject in limits:
        kind, _, name = subject.partition(":")
        if kind == "tenant":
            active.setdefault(name, 0)
    quotas = await services.quotas.all()
    for name in quotas:
        active.setdefault(name, 0)
    priorities = await services.priorities.all()
    for subject in priorities:
        kind, _, name = subject.partition(":")
        if kind == "tenant":
            active.setdefault(name, 0)
    budgets = {name: await budget_view(services, tenant_subject(name)) for name in active}
    return {
        "object": "list",
        "data": [
            {
                "object": "tenant",
                "tenant": name,
                "active_keys": count,
                "limits": msgspec.structs.asdict(limits.get(tenant_subject(name)) or RateLimits()),
                "quota": msgspec.structs.asdict(quotas[name]) if name in quotas else None,
                "priority": priorities.get(tenant_subject(name)),
                "budget": budgets[name],
            }
            for name, count in sorted(active.items())
        ],
    }


@router.put("/tenants/{tenant}/limits")
async def set_tenant_limits(
    tenant: TenantName, body: TenantLimitsBody, caller: AdminDep, services: ServicesDep
) -> dict[str, Any]:
    """A tenant's limits, shared by all its keys (each key may have its own as well)."""
    await apply_tenant_settings(services, tenant, body)
    await services.ratelimits.set_limits(tenant_subject(tenant), body.limits())
    await services.priorities.set(tenant_subject(tenant), body.priority)
    services.executor.forget_priorities()
    return {
        **_limits_view("tenant", tenant, body.limits()),
        "priority": body.priority,
        **await tenant_settings_view(services, tenant),
    }


@router.get("/tenants/{tenant}/limits")
async def get_tenant_limits(
    tenant: TenantName, caller: AdminDep, services: ServicesDep
) -> dict[str, Any]:
    subject = tenant_subject(tenant)
    return {
        **_limits_view("tenant", tenant, await services.ratelimits.limits(subject)),
        "priority": await services.priorities.get(subject),
        **await tenant_settings_view(services, tenant),
    }


@router.get("/keys/{key_id}/limits")
async def get_key_limits(key_id: str, caller: AdminDep, services: ServicesDep) -> dict[str, Any]:
    await _known_key(services, key_id)
    subject = key_subject(key_id)
    return {
        **_limits_view("key", key_id, await services.ratelimits.limits(subject)),
        "priority": await services.priorities.get(subject),
        "budget": await budget_view(services, subject),
    }


async def _known_key(services: ServicesDep, key_id: str) -> None:
    if not any(r.key_id == key_id for r in await services.state.list_api_keys()):
        raise NotFound(f"No key with id {key_id!r}. 'ebb keys list' shows them.", param="key_id")


@router.put("/keys/{key_id}/limits")
async def set_key_limits(
    key_id: str, body: RateLimitsBody, caller: AdminDep, services: ServicesDep
) -> dict[str, Any]:
    await _known_key(services, key_id)
    await apply_budget(services, key_subject(key_id), body)
    await services.ratelimits.set_limits(key_subject(key_id), body.limits())
    await services.priorities.set(key_subject(key_id), body.priority)
    services.executor.forget_priorities()
    return {
        **_limits_view("key", key_id, body.limits()),
        "priority": body.priority,
        "budget": await budget_view(services, key_subject(key_id)),
    }
