"""Admission's choice of a deployment's version: the traffic split, by a caller's key.

A request names a deployment (`model`); it is queued for one of its versions' serving
units, picked by the deployment's traffic split (`ebb.queue.versions`): a stable hash of
the `x-ebb-route-key` header, so one user or session stays on one version while a canary
ramps up, or at random without one. The answer names the version in `x-ebb-version`.
"""

from __future__ import annotations

from collections.abc import Mapping

from ebb.errors import NotFound
from ebb.frontdoor import tenancy
from ebb.frontdoor.caller import Caller
from ebb.queue.platform import PlatformState
from ebb.queue.schema import DeploymentSpec
from ebb.queue.version_store import VersionStore
from ebb.queue.versions import pick_version, route_point, split_unit, unit_name

ROUTE_KEY_HEADER = "x-ebb-route-key"
VERSION_HEADER = "x-ebb-version"


async def route(
    state: PlatformState, deployment: str, headers: Mapping[str, str] | None = None
) -> DeploymentSpec | None:
    """The spec of the serving unit that takes a request for `deployment` (its name is
    the unit's: `version_of` tells the version); None when there is no such deployment."""
    store = VersionStore(state.redis)
    split = await store.split(deployment)
    key = headers.get(ROUTE_KEY_HEADER) if headers is not None else None
    version = pick_version(split.weights, route_point(key))
    return await store.unit_spec(unit_name(deployment, version))


async def routed(
    state: PlatformState,
    caller: Caller,
    deployment: str,
    headers: Mapping[str, str] | None = None,
) -> DeploymentSpec:
    """`route` for a deployment `caller` may call; the model's 404 otherwise."""
    await tenancy.visible_deployment(state, caller, deployment)
    spec = await route(state, deployment, headers)
    if spec is None:  # deleted a moment ago
        await tenancy.visible_deployment(state, caller, deployment)  # raises its 404
        raise NotFound(f"The model {deployment!r} does not exist.", param="model")
    return spec


def version_of(spec: DeploymentSpec) -> int:
    return split_unit(spec.name)[1]


def version_headers(spec: DeploymentSpec) -> dict[str, str]:
    return {VERSION_HEADER: str(version_of(spec))}
