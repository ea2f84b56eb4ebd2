"""Spend caps in the API: the `budget` of a tenant's or a key's limits, a tenant's
`webhook_url` (where its budget.soft_limit_reached events go), and GET /v1/budgets, the
caller's own budgets and what they spent this period.

Budgets are set through the limits routes (`routes_limits.py`, PUT
/v1/tenants/{t}/limits and /v1/keys/{id}/limits): a body without `budget` leaves the
budget as it is (so setting a rate limit never drops a budget), `"budget": null` removes
it. The same holds for a tenant's `webhook_url`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from ebb.errors import InvalidRequest, PermissionDenied
from ebb.frontdoor.auth import CallerDep
from ebb.frontdoor.services import Services, ServicesDep
from ebb.queue.budget_periods import Period
from ebb.queue.budget_schema import DEFAULT_SOFT_LIMIT, Budget
from ebb.queue.ratelimits import key_subject, tenant_subject
from ebb.webhooks.ssrf import UnsafeUrl, resolve_target

router = APIRouter(prefix="/v1")

# A budget's amount stays exact in the Lua scripts' numbers (doubles, 2^53).
MAX_BUDGET_MICROS = 10**15


class BudgetBody(BaseModel):
    """A spend cap: `amount_micros` (1_000_000 = 1.00, the unit of every price) per
    `period` ("day", "month" in UTC, or null: the whole lifetime); `soft_limit` is the
    fraction of it whose crossing sends the tenant's webhook once per period."""

    model_config = ConfigDict(extra="forbid")

    amount_micros: int = Field(ge=0, le=MAX_BUDGET_MICROS, strict=True)
    period: Literal["day", "month"] | None = None
    soft_limit: float = Field(DEFAULT_SOFT_LIMIT, gt=0, le=1)

    def budget(self) -> Budget:
        return Budget(
            amount_micros=self.amount_micros,
            period=Period(self.period) if self.period else Period.LIFETIME,
            soft_limit=self.soft_limit,
        )


class BudgetFields(BaseModel):
    """What the limits bodies take for spend caps (mixed into them)."""

    budget: BudgetBody | None = None


class TenantFields(BudgetFields):
    # Where the tenant's own events (budget.soft_limit_reached) are delivered, signed
    # like job events with the tenant's webhook secret.
    webhook_url: str | None = Field(None, min_length=1, max_length=2048)


async def apply_budget(services: Services, subject: str, body: BudgetFields) -> None:
    """Store what the body says of the subject's budget (nothing when it leaves it out)."""
    if "budget" in body.model_fields_set:
        await services.budgets.set_budget(subject, body.budget.budget() if body.budget else None)
        if services.budget_presence is not None:
            services.budget_presence.forget()  # this frontdoor applies it at once


async def apply_tenant_settings(services: Services, tenant: str, body: TenantFields) -> None:
    """The budget and webhook URL a tenant's limits body sets. The URL is checked as a job's
    webhook URL is (and again at every delivery): 400 `unsafe_webhook_url` naming it."""
    if "webhook_url" in body.model_fields_set and body.webhook_url is not None:
        try:
            await resolve_target(body.webhook_url, services.settings.webhook_allowed_networks)
        except UnsafeUrl as e:
            message = str(e).replace("webhook.url", "webhook_url")
            raise InvalidRequest(message, param="webhook_url", code="unsafe_webhook_url") from e
    await apply_budget(services, tenant_subject(tenant), body)
    if "webhook_url" in body.model_fields_set:
        await services.budgets.set_tenant_webhook(tenant, body.webhook_url)


async def budget_view(services: Services, subject: str) -> dict[str, Any] | None:
    """A subject's budget and its spend this period, as the API shows it (None: none)."""
    budget = await services.budgets.budget(subject)
    if budget is None:
        return None
    spend = await services.budgets.spend(subject, budget)
    return {
        "amount_micros": budget.amount_micros,
        "period": None if budget.period is Period.LIFETIME else str(budget.period),
        "soft_limit": budget.soft_limit,
        **msgspec.structs.asdict(spend),
    }


async def tenant_settings_view(services: Services, tenant: str) -> dict[str, Any]:
    return {
        "budget": await budget_view(services, tenant_subject(tenant)),
        "webhook_url": await services.budgets.tenant_webhook(tenant),
    }


@router.get("/budgets")
async def get_budgets(
    caller: CallerDep,
    services: ServicesDep,
    tenant: str | None = Query(None, max_length=64),
    key_id: str | None = Query(None, max_length=128),
) -> dict[str, Any]:
    """The caller's budgets (its key's and its tenant's) with this period's spend; the
    admin names a `tenant` (and optionally a `key_id`), or sees every budget set."""
    if caller.is_admin:
        if tenant is None:
            return {"object": "list", "data": await _every_budget(services)}
        whose_tenant, whose_key = tenant, key_id
    else:
        if (tenant not in (None, caller.tenant)) or (key_id not in (None, caller.key_id)):
            raise PermissionDenied("A tenant key shows its own budgets only; leave them out.")
        whose_tenant, whose_key = caller.tenant, caller.key_id
    owners: list[str | None] = [None, whose_key] if whose_key else [None]
    data = [
        {
            "object": "budget",
            "tenant": whose_tenant,
            "key_id": key,
            "budget": await budget_view(
                services, key_subject(key) if key else tenant_subject(whose_tenant)
            ),
        }
        for key in owners
    ]
    return {"object": "list", "data": data}


async def _every_budget(services: Services) -> list[dict[str, Any]]:
    """Every subject with a budget, tenants first, as GET /v1/budgets lists them."""
    tenants = {r.key_id: r.tenant for r in await services.state.list_api_keys()}
    rows = []
    for subject in sorted(await services.budgets.all_budgets(), key=lambda s: (s[0] == "k", s)):
        kind, _, name = subject.partition(":")
        rows.append(
            {
                "object": "budget",
                "tenant": name if kind == "tenant" else tenants.get(name),
                "key_id": name if kind == "key" else None,
                "budget": await budget_view(services, subject),
            }
        )
    return rows
