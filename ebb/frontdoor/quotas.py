"""Tenant quotas as policy: what a tenant's deployments use, and whether a change fits.

Pure functions over deployment specs, so the same check runs inside the store's WATCH
(`ebb.queue.quotas.QuotaStore.put_deployment`) and in unit tests. A change is refused
only when it raises a use that ends up over its limit: a tenant over a quota the admin
lowered may still scale down or delete, never up.
"""

from __future__ import annotations

from dataclasses import dataclass

from ebb.errors import QuotaExceeded
from ebb.queue.quotas import TenantQuota
from ebb.queue.schema import DeploymentSpec
from ebb.weights_cache.sources import normalize_source, within_prefix

ANY_SOURCE = "*"


@dataclass(frozen=True)
class QuotaUse:
    deployments: int = 0
    replicas: int = 0
    gpus: int = 0


def gpus_of(spec: DeploymentSpec) -> int:
    """The GPUs a deployment may hold at its peak: max_replicas × tensor_parallel_size."""
    return spec.max_replicas * (spec.engine.tensor_parallel_size or 1)


def use_of(specs: list[DeploymentSpec]) -> QuotaUse:
    return QuotaUse(
        deployments=len(specs),
        replicas=sum(s.max_replicas for s in specs),
        gpus=sum(gpus_of(s) for s in specs),
    )


def owned(tenant: str, specs: dict[str, DeploymentSpec]) -> dict[str, DeploymentSpec]:
    return {name: s for name, s in specs.items() if s.owner == tenant}


def _raise_quota(tenant: str, what: str, option: str) -> None:
    raise QuotaExceeded(
        f"{what} Lower it, delete a deployment ('ebb deployments delete NAME'), or ask the "
        f"admin to raise the quota ('ebb tenants quota {tenant} {option} N', "
        f"PUT /v1/tenants/{tenant}/quota).",
        param=option.removeprefix("--").replace("-", "_"),
    )


def check_source(tenant: str, quota: TenantQuota | None, source: str) -> None:
    """Refuse a source outside the tenant's allowed prefixes (none: nothing allowed).

    The source and the prefixes are compared normalized, on segment boundaries
    (`ebb.weights_cache.sources.within_prefix`); a source that climbs (`..`, `%2e%2e`) is
    an `InvalidRequest` whatever the prefixes. Nothing here looks at the filesystem, so
    the answer never depends on whether a path exists.
    """
    allowed = quota.allowed_sources if quota else []
    normalized = normalize_source(source)
    if any(p == ANY_SOURCE or within_prefix(normalized, p) for p in allowed):
        return
    if not allowed:
        reason = f"Tenant {tenant!r} may not deploy from any source yet."
    else:
        listed = ", ".join(repr(p) for p in allowed)
        reason = f"Tenant {tenant!r} may deploy only sources starting with {listed}."
    raise QuotaExceeded(
        f"{reason} The admin allows a prefix with 'ebb tenants quota {tenant} "
        f"--allow-source PREFIX' (PUT /v1/tenants/{tenant}/quota, allowed_sources).",
        param="source",
    )


def check_change(
    tenant: str,
    quota: TenantQuota | None,
    before: dict[str, DeploymentSpec],
    after: dict[str, DeploymentSpec],
) -> None:
    """Refuse `before` → `after` (the tenant's own deployments) if it raises a use past
    its limit; the message names the limit and how to change it."""
    limits = quota or TenantQuota()
    old, new = use_of(list(before.values())), use_of(list(after.values()))
    if new.deployments > max(limits.max_deployments, old.deployments):
        if quota is None:
            raise QuotaExceeded(
                f"Tenant {tenant!r} has no deployment quota yet: the admin grants one with "
                f"'ebb tenants quota {tenant} --max-deployments N --max-replicas N "
                f"--allow-source PREFIX' (PUT /v1/tenants/{tenant}/quota).",
                param="max_deployments",
            )
        _raise_quota(
            tenant,
            f"Tenant {tenant!r} may own at most {limits.max_deployments} deployments and owns "
            f"{old.deployments}.",
            "--max-deployments",
        )
    if new.replicas > max(limits.max_replicas, old.replicas):
        _raise_quota(
            tenant,
            f"This would give tenant {tenant!r} up to {new.replicas} replicas (max_replicas "
            f"summed over its deployments); its quota is {limits.max_replicas}.",
            "--max-replicas",
        )
    if new.gpus > max(limits.max_gpus, old.gpus):
        _raise_quota(
            tenant,
            f"This would let tenant {tenant!r} hold up to {new.gpus} GPUs (max_replicas × "
            f"tensor_parallel_size, summed over its deployments); its quota is "
            f"{limits.max_gpus}.",
            "--max-gpus",
        )
