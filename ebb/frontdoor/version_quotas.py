"""How many versions a deployment keeps, and whether a tenant's new version fits its quota.

Every deployment keeps at most `MAX_VERSIONS_KEPT` versions, the admin's too: each is
stored with its environment and is a unit the controller looks at every pass. A tenant
keeps at most its quota's `max_versions` (below that). Past the limit a deploy is refused
with the way out: delete old versions (`DELETE /v1/deployments/NAME/versions/N`).

A tenant's new version must fit its GPU and replica quotas serving alone (as it will once
rolled out); the rollout, which runs it beside the old one, is checked when it starts.
"""

from __future__ import annotations

from ebb.errors import Conflict, EbbError, QuotaExceeded
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.quotas import alone, check_change, footprints
from ebb.frontdoor.services import Services
from ebb.queue.quotas import DEFAULT_MAX_VERSIONS, TenantQuota
from ebb.queue.schema import DeploymentSpec
from ebb.queue.version_store import MAX_VERSIONS_KEPT


def versions_limit(quota: TenantQuota | None, *, admin: bool) -> int:
    """The versions a deployment may keep: the platform's cap, a tenant's quota below it."""
    if admin:
        return MAX_VERSIONS_KEPT
    return min(quota.max_versions if quota else DEFAULT_MAX_VERSIONS, MAX_VERSIONS_KEPT)


def versions_refusal(caller: Caller, name: str, kept: int, limit: int) -> EbbError:
    way_out = (
        f"Delete versions it no longer needs (DELETE /v1/deployments/{name}/versions/N; "
        f"GET /v1/deployments/{name}/versions lists them) and deploy again."
    )
    if caller.is_admin:
        return Conflict(
            f"{name!r} keeps {kept} versions, the most a deployment may keep ({limit}). " + way_out,
            param="name",
        )
    return QuotaExceeded(
        f"{name!r} keeps {kept} versions, the most tenant {caller.tenant!r} may keep per "
        f"deployment ({limit}). {way_out} The admin may raise it ('ebb tenants quota "
        f"{caller.tenant} --max-versions N', PUT /v1/tenants/{caller.tenant}/quota).",
        param="max_versions",
    )


async def check_version_quota(
    services: Services,
    tenant: str,
    quota: TenantQuota | None,
    existing: DeploymentSpec,
    version: DeploymentSpec,
) -> None:
    """Refuse a new `version` of `existing` that could not serve within the quota."""
    holdings, _ = await services.quotas.holdings(tenant, existing.name)
    before = footprints(tenant, holdings)
    spec = holdings.specs.get(existing.name, existing)
    check_change(tenant, quota, before, {**before, existing.name: alone(spec, version)})
