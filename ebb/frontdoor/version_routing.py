"""Admission's choice of a deployment's version: the traffic split, by a caller's key.

A request names a deployment (`model`); it is queued for one of its versions' serving
units, picked by the deployment's traffic split (`ebb.queue.versions`): a stable hash of
the `x-ebb-route-key` header, so one user or session stays on one version while a canary
ramps up, or at random without one. The answer names the version in `x-ebb-version`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ebb.frontdoor import tenancy
from ebb.frontdoor.caller import Caller
from ebb.queue.platform import PlatformState
from ebb.queue.schema import DeploymentSpec
from ebb.queue.versions import pick_version, route_point, split_unit

ROUTE_KEY_HEADER = "x-ebb-route-key"
VERSION_HEADER = "x-ebb-version"


@dataclass(frozen=True)
class Routed:
    """The serving unit a request goes to: its spec (its name is the unit's: `version_of`
    tells the version), and its status and queue depth as admission reads them."""

    spec: DeploymentSpec
    status: dict[str, str]
    depth: int


async def routed(
    state: PlatformState,
    caller: Caller,
    deployment: str,
    headers: Mapping[str, str] | None = None,
) -> Routed:
    """The unit that takes a request for `deployment`, which `caller` may call; the
    model's 404 otherwise, also for a deployment deleted while being read. One Redis
    round trip when the split picks version 1, two when it picks another."""
    reads = state.admission_reads
    read = await reads.deployment(deployment)
    spec = tenancy.visible_or_404(caller, deployment, read.spec)
    key = headers.get(ROUTE_KEY_HEADER) if headers is not None else None
    version = pick_version(read.split.weights, route_point(key))
    if version != 1:
        read = await reads.unit(deployment, version)
        # Deleted since the first read (or its version is): the same 404 as a missing one.
        spec = tenancy.visible_or_404(caller, deployment, read.spec)
    return Routed(spec=spec, status=read.status, depth=read.depth)


def version_of(spec: DeploymentSpec) -> int:
    return split_unit(spec.name)[1]


def version_headers(spec: DeploymentSpec) -> dict[str, str]:
    return {VERSION_HEADER: str(version_of(spec))}
