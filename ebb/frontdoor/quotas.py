"""Tenant quotas as policy: what a tenant's deployments use, and whether a change fits.

Pure functions over deployment specs, their traffic splits and versions, so the same
check runs inside the store's WATCH (`ebb.queue.quotas.QuotaStore`) and in unit tests.
A deployment counts at its peak (`Footprint`): every version that holds or may hold
runners (with traffic, or either end of a rollout) at max_replicas. A change is refused
only when it raises a use that ends up over its limit: a tenant over a quota the admin
lowered may still scale down or delete, never up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ebb.errors import QuotaExceeded
from ebb.queue.quotas import Holdings, TenantQuota
from ebb.queue.schema import DeploymentSpec
from ebb.queue.versions import TrafficSplit, VersionRecord
from ebb.weights_cache.sources import normalize_source, within_prefix

ANY_SOURCE = "*"


@dataclass(frozen=True)
class QuotaUse:
    deployments: int = 0
    replicas: int = 0
    gpus: int = 0


@dataclass(frozen=True)
class Footprint:
    """One deployment at its peak, as quotas count it: its max_replicas, and the GPUs per
    replica of each version that holds or may hold runners (`live_versions`). Every such
    version scales to max_replicas on its own (during a rollout both ends may), so the
    deployment may hold max_replicas × that many runners and max_replicas × their GPUs."""

    max_replicas: int
    version_gpus: tuple[int, ...]

    @property
    def replicas(self) -> int:
        return self.max_replicas * len(self.version_gpus)

    @property
    def gpus(self) -> int:
        return self.max_replicas * sum(self.version_gpus)


def gpus_per_replica(spec: DeploymentSpec) -> int:
    """A runner's GPUs: tensor_parallel_size (unset: 1)."""
    return spec.engine.tensor_parallel_size or 1


def gpus_of(spec: DeploymentSpec) -> int:
    """The GPUs a deployment of one version may hold at its peak."""
    return spec.max_replicas * gpus_per_replica(spec)


def live_versions(split: TrafficSplit) -> set[int]:
    """The versions that hold or may hold runners: those with traffic, and both ends of
    a rollout in progress (the new one warms before it takes any). A version at 0 % after
    a finished rollout or a rollback only drains (`RETIRED_IDLE_S`): not counted."""
    live = {v for v, w in split.weights.items() if w > 0}
    rollout = split.rollout
    if rollout is not None and rollout.active:
        live |= {rollout.from_version, rollout.to_version}
    return live


def footprint(
    spec: DeploymentSpec, split: TrafficSplit, versions: Mapping[int, VersionRecord]
) -> Footprint:
    """`spec` (the deployment's record) with its split and version records. A LoRA
    adapter holds no runners: it counts as a deployment, with no replicas or GPUs."""
    if spec.base:
        return Footprint(0, (0,))
    gpus = []
    for number in sorted(live_versions(split)):
        record = versions.get(number)
        # Version 1 before any other was deployed is the deployment's record itself.
        gpus.append(gpus_per_replica(record.spec if record else spec))
    return Footprint(spec.max_replicas, tuple(gpus) or (gpus_per_replica(spec),))


def alone(spec: DeploymentSpec, version: DeploymentSpec) -> Footprint:
    """The deployment `spec` serving only `version` (a new version, once rolled out)."""
    return Footprint(spec.max_replicas, (gpus_per_replica(version),))


def use_of(footprints: Iterable[Footprint]) -> QuotaUse:
    counted = list(footprints)
    return QuotaUse(
        deployments=len(counted),
        replicas=sum(f.replicas for f in counted),
        gpus=sum(f.gpus for f in counted),
    )


def owned(tenant: str, specs: dict[str, DeploymentSpec]) -> dict[str, DeploymentSpec]:
    return {name: s for name, s in specs.items() if s.owner == tenant}


def footprints(tenant: str, holdings: Holdings) -> dict[str, Footprint]:
    """Each of `tenant`'s deployments in `holdings` at its peak."""
    return {
        name: footprint(spec, holdings.split(name), holdings.versions.get(name, {}))
        for name, spec in owned(tenant, holdings.specs).items()
    }


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
    before: Mapping[str, Footprint],
    after: Mapping[str, Footprint],
) -> None:
    """Refuse `before` → `after` (the tenant's own deployments at their peaks) if it
    raises a use past its limit; the message names the limit and how to change it."""
    limits = quota or TenantQuota()
    old, new = use_of(before.values()), use_of(after.values())
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
            f"summed over its deployments and their serving versions; a rollout runs two); "
            f"its quota is {limits.max_replicas}.",
            "--max-replicas",
        )
    if new.gpus > max(limits.max_gpus, old.gpus):
        _raise_quota(
            tenant,
            f"This would let tenant {tenant!r} hold up to {new.gpus} GPUs (max_replicas × "
            f"tensor_parallel_size, summed over its deployments and their serving versions; "
            f"a rollout runs two); its quota is {limits.max_gpus}.",
            "--max-gpus",
        )
