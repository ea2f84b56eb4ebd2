"""Deploying a new version of an existing deployment, and what the API shows of versions.

The create path of `POST /v1/deployments` hands an existing name here: the body's
version fields (source, engine and serving options, prices, context length, env) over
the latest version's make the next version, which takes no traffic until a rollout moves
some to it (`routes_versions`). Its weights are prefetched at once (the controller's
preparer works per serving unit) so that a rollout finds them in the cache.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from ebb.errors import Conflict
from ebb.frontdoor.services import Services
from ebb.queue.platform import PlatformState
from ebb.queue.schema import DeploymentSpec, RunnerState
from ebb.queue.version_store import VersionStore
from ebb.queue.versions import (
    VERSION_FIELDS,
    VersionRecord,
    split_unit,
    unit_name,
)
from ebb.queue.weights_status import WeightsState, WeightsStatus
from ebb.secrets import SecretBox, check_env

# PATCH fields a version fixes (source is never patched).
_PATCHED_VERSION_FIELDS = frozenset(VERSION_FIELDS) - {"source"}


def seal_env(services: Services, env: dict[str, str] | None) -> tuple[list[str], str]:
    """(names, ciphertext) of a version's env; a 400 when it has one and there is no key."""
    if not env:
        return [], ""
    check_env(env)
    return sorted(env), SecretBox(services.settings.secrets_key).seal(env)


async def keep_first_env(
    services: Services, spec: DeploymentSpec, env: dict[str, Any] | None
) -> None:
    """A new deployment created with an env: version 1 is stored to hold it."""
    names, sealed = seal_env(services, env)
    if sealed:
        record = VersionRecord(
            version=1, created_at_s=spec.created_at_s, spec=spec, env_names=names, env_sealed=sealed
        )
        await VersionStore(services.state.redis).keep_first(record, spec.name)


async def latest_version(store: VersionStore, existing: DeploymentSpec) -> VersionRecord:
    versions = await store.versions(existing.name)
    if versions:
        return versions[max(versions)]
    return VersionRecord(version=1, created_at_s=existing.created_at_s, spec=existing)


async def deploy_version(
    services: Services,
    existing: DeploymentSpec,
    changes: Callable[[DeploymentSpec], dict[str, Any]],
    env: dict[str, str] | None,
    check: Callable[[DeploymentSpec], Awaitable[None]],
    *,
    max_versions: int,
) -> VersionRecord:
    """Store the next version of `existing`: `changes(latest spec)` gives the body's
    fields merged over the latest version's; only VERSION_FIELDS of them count (replicas,
    idle timeout and the like are the deployment's: PATCH changes them). `check` refuses
    the composed spec; `TooManyVersions` when `max_versions` are kept already."""
    store = VersionStore(services.state.redis)
    latest = await latest_version(store, existing)
    given = {k: v for k, v in changes(latest.spec).items() if k in VERSION_FIELDS}
    base = msgspec.structs.replace(existing, **{f: getattr(latest.spec, f) for f in VERSION_FIELDS})
    spec = msgspec.structs.replace(base, **given, created_at_s=time.time())
    await check(spec)
    names, sealed = (
        (latest.env_names, latest.env_sealed) if env is None else seal_env(services, env)
    )
    await store.keep_first(
        VersionRecord(version=1, created_at_s=existing.created_at_s, spec=existing), existing.name
    )
    record = await store.add(
        existing.name,
        lambda n: VersionRecord(
            version=n, created_at_s=spec.created_at_s, spec=spec, env_names=names, env_sealed=sealed
        ),
        max_versions=max_versions,
    )
    unit = unit_name(existing.name, record.version)
    # An adapter's version has no weights preparation of its own (its base's runners
    # fetch it through their cache on its first request).
    if not spec.base and services.engines.entry_for(spec.source).prepares_weights:
        await services.state.set_deployment_status(
            unit, **WeightsStatus(WeightsState.PREPARING).fields()
        )
    await services.state.wake(unit)
    return record


async def refuse_version_fields(state: PlatformState, name: str, given: set[str]) -> None:
    """PATCH may not change what a version fixes once a deployment has versions."""
    fixed = sorted(given & _PATCHED_VERSION_FIELDS)
    if fixed and await VersionStore(state.redis).versions(name):
        raise Conflict(
            f"{', '.join(fixed)} of {name!r} belong to its versions, which do not change: "
            f"deploy a new version (POST /v1/deployments with name {name!r}, 'ebb deploy') "
            "and roll it out.",
            param=fixed[0],
        )


async def version_summary(state: PlatformState, spec: DeploymentSpec) -> dict[str, Any]:
    """What a deployment's view says of its versions: the serving (primary) version's
    fields, the traffic split and the rollout in progress."""
    store = VersionStore(state.redis)
    split = await store.split(spec.name)
    primary = split.primary
    record = await store.version(spec.name, primary)
    shown = (
        {f: msgspec.to_builtins(getattr(record.spec, f)) for f in VERSION_FIELDS} if record else {}
    )
    return {
        **shown,
        "version": primary,
        "traffic": {str(v): w for v, w in sorted(split.weights.items())},
        "rollout": msgspec.to_builtins(split.rollout) if split.rollout else None,
    }


async def versions_view(state: PlatformState, existing: DeploymentSpec) -> dict[str, Any]:
    """`GET /v1/deployments/NAME/versions`: each version, its traffic and its runners."""
    store = VersionStore(state.redis)
    split = await store.split(existing.name)
    versions = await store.versions(existing.name) or {
        1: VersionRecord(version=1, created_at_s=existing.created_at_s, spec=existing)
    }
    runners = [r for r in await state.runners() if split_unit(r.deployment)[0] == existing.name]
    units = [unit_name(existing.name, n) for n in versions]
    statuses = await state.deployment_statuses(units)
    data = []
    for number, record in sorted(versions.items()):
        unit = unit_name(existing.name, number)
        mine = [r for r in runners if r.deployment == unit and r.state.is_live]
        data.append(
            {
                "object": "deployment.version",
                "version": number,
                "created_at_s": record.created_at_s,
                **{f: msgspec.to_builtins(getattr(record.spec, f)) for f in VERSION_FIELDS},
                "env": record.env_names,  # names only, never values
                "traffic_pct": split.weights.get(number, 0),
                "weights": statuses[unit].get("weights", "unknown"),
                "ready_replicas": sum(r.state is RunnerState.READY for r in mine),
                "replicas": len(mine),
            }
        )
    return {
        "object": "list",
        "deployment": existing.name,
        "data": data,
        "traffic": {str(v): w for v, w in sorted(split.weights.items())},
        "rollout": msgspec.to_builtins(split.rollout) if split.rollout else None,
    }
