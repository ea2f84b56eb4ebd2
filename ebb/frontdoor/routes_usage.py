"""Usage: tokens, GPU-seconds and cost from the ledger's hourly aggregates.

A tenant's key sees that tenant's usage only (another tenant's is 404, as if it did not
exist); the admin key sees every tenant's and can reconcile the ledger.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter

from ebb.billing.adapter_gpu import AdapterOf
from ebb.billing.entries import hour_floor, hour_iso
from ebb.billing.export import exporter_from
from ebb.billing.reconcile import reconcile
from ebb.billing.usage import GROUP_KEYS, UsageQuery, report, with_unfolded
from ebb.errors import InvalidRequest, NotFound
from ebb.frontdoor.auth import AdminDep, CallerDep
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.services import ServicesDep
from ebb.queue.ledger import HOUR_MS

router = APIRouter(prefix="/v1")

# Raw records per stream a report folds in itself when the consumer has not yet.
UNFOLDED_LIMIT = 10_000


@router.get("/usage")
async def usage(
    caller: CallerDep,
    services: ServicesDep,
    start: str | None = None,
    end: str | None = None,
    group_by: str = "deployment",
    tenant: str | None = None,
) -> dict[str, Any]:
    """Usage in [start, end), whole hours (unix seconds or ISO 8601 dates/times, UTC)."""
    query = UsageQuery(
        start_ms=hour_floor(parse_time(start, "start")) if start else 0,
        end_ms=_hour_ceil(parse_time(end, "end") if end else int(time.time() * 1000)),
        group_by=parse_group_by(group_by),
        tenant=_visible_tenant(caller, tenant),
    )
    if query.end_ms <= query.start_ms:
        raise InvalidRequest("end must be after start.", param="end")
    view = await services.ledger.view(query.start_ms, query.end_ms, tail_limit=UNFOLDED_LIMIT)
    adapters = {
        s.name: AdapterOf(base=s.base, owner=s.owner, uid=s.uid)
        for s in await services.state.list_deployments()
        if s.base
    }
    cost = services.settings.gpu_second_cost_micros
    body = report(with_unfolded(view), query, cost, adapters)
    return {
        "object": "usage",
        "start": hour_iso(query.start_ms),
        "end": hour_iso(query.end_ms),
        "group_by": list(query.group_by),
        "tenant": query.tenant,
        **body,
        # Records not folded yet are included; "complete" is false only when the consumer
        # is so far behind that more were waiting than a report reads.
        "ledger": {"unfolded_records": len(view.tail), "complete": view.tail_complete},
    }


@router.get("/usage/reconcile")
async def reconcile_usage(caller: AdminDep, services: ServicesDep) -> dict[str, Any]:
    """Recompute the aggregates (and exported hour files) from the raw records."""
    result = await reconcile(services.ledger, exporter_from(services.settings))
    return {"object": "usage.reconcile", **result.to_dict()}


def _visible_tenant(caller: Caller, tenant: str | None) -> str | None:
    if caller.is_admin:
        return tenant
    if tenant is not None and tenant != caller.tenant:
        # 404, not 403: a tenant must not learn whether another tenant exists.
        raise NotFound(f"No tenant {tenant!r}.", param="tenant")
    return caller.tenant


def parse_time(text: str, param: str) -> int:
    """Unix seconds or an ISO 8601 date/time (UTC unless it says otherwise), as ms."""
    try:
        return int(float(text) * 1000)
    except (ValueError, OverflowError):
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:
        raise InvalidRequest(
            f"{param}={text!r} is neither unix seconds nor an ISO 8601 date or time "
            "(e.g. 2025-01-31 or 2025-01-31T10:00:00Z).",
            param=param,
        ) from e
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def parse_group_by(text: str) -> tuple[str, ...]:
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in keys if k not in GROUP_KEYS]
    if unknown or not keys or len(set(keys)) != len(keys):
        raise InvalidRequest(
            f"group_by={text!r}: use one or more of {', '.join(GROUP_KEYS)}, comma-separated "
            "(e.g. group_by=deployment or group_by=tenant,day).",
            param="group_by",
        )
    return keys


def _hour_ceil(ms: int) -> int:
    return math.ceil(ms / HOUR_MS) * HOUR_MS
