"""A deployment's versions and rollouts: history, roll out, promote, roll back. The admin
manages every deployment's, a tenant those of its own deployments (`tenancy`).

`POST /v1/deployments` with an existing name deploys a new version (`deploy_versions`);
these endpoints move traffic between versions. Transitions are `ebb.queue.rollout`'s;
the controller carries out what waits on runners or a schedule (`ebb.coldstart.rollouts`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ebb.errors import Conflict, InvalidRequest, NotFound
from ebb.frontdoor import tenancy
from ebb.frontdoor.auth import CallerDep
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.deploy_versions import versions_view
from ebb.frontdoor.services import Services, ServicesDep
from ebb.queue.job_moves import JobMoves
from ebb.queue.rollout import RolloutRefused, canary_steps, promote, rollback, start
from ebb.queue.schema import DeploymentSpec
from ebb.queue.version_store import VersionInUse, VersionStore
from ebb.queue.versions import Rollout, TrafficSplit, unit_name

router = APIRouter(prefix="/v1/deployments")


class RolloutBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int | None = Field(
        None, ge=1, description="The version to roll out (default: latest)."
    )
    strategy: Literal["immediate", "canary"] = Field(
        "immediate",
        description="immediate: all traffic once it has a ready runner; canary: in steps.",
    )
    canary_pct: int | None = Field(None, ge=1, le=99, description="A canary's first share.")
    steps: list[int] | None = Field(
        None, min_length=1, max_length=20, description="A canary's shares, e.g. [10, 50, 100]."
    )
    interval_s: float = Field(
        0.0, ge=0, le=86400, description="Seconds per step, promoted automatically; 0: by hand."
    )
    max_error_rate_increase: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Roll back when the new version's error rate is this much higher.",
    )
    max_ttft_increase_pct: float = Field(
        50.0, ge=0, le=10_000, description="Roll back when its p99 TTFT is this much higher (%)."
    )
    min_requests: int = Field(20, ge=1, le=100_000, description="Requests per step before judging.")

    @model_validator(mode="after")
    def _canary_needs_a_share(self) -> RolloutBody:
        if self.strategy == "canary" and self.canary_pct is None and not self.steps:
            raise ValueError("a canary rollout needs canary_pct or steps")
        if any(not 1 <= s <= 100 for s in self.steps or []):
            raise ValueError("steps are traffic percentages from 1 to 100")
        return self


async def _owned(services: Services, caller: Caller, name: str) -> DeploymentSpec:
    """The deployment `caller` may roll out: 404 when it may not see it, 403 when it only
    calls it."""
    return await tenancy.managed_deployment(services.state, caller, name)


async def _change(
    services: Services,
    caller: Caller,
    spec: DeploymentSpec,
    change: Callable[[TrafficSplit], TrafficSplit],
    *,
    quota: bool = False,
) -> TrafficSplit:
    """Apply `change` to the split; with `quota`, a tenant's change is checked against its
    quota atomically with the write (starting a rollout, rolling back)."""
    try:
        if quota:
            return await tenancy.store_split(services, caller, spec, change)
        return await VersionStore(services.state.redis).update_split(spec.name, change)
    except RolloutRefused as e:
        raise Conflict(f"{spec.name!r}: {e}") from e


@router.get("/{name}/versions")
async def list_versions(name: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    return await versions_view(services.state, await _owned(services, caller, name))


@router.post("/{name}/rollout")
async def start_rollout(
    name: str, body: RolloutBody, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    spec = await _owned(services, caller, name)
    store = VersionStore(services.state.redis)
    versions = await store.versions(name)
    target = body.version or max(versions, default=1)
    if target != 1 and target not in versions:
        raise InvalidRequest(
            f"{name!r} has no version {target}; GET /v1/deployments/{name}/versions lists them.",
            param="version",
        )
    steps = canary_steps(body.canary_pct, body.steps) if body.strategy == "canary" else [100]
    now = time.time()

    def begin(split: TrafficSplit) -> TrafficSplit:
        rollout = Rollout(
            from_version=split.primary,
            to_version=target,
            strategy=body.strategy,
            steps=steps,
            interval_s=body.interval_s,
            started_at_s=now,
            step_started_at_s=now,
            max_error_rate_increase=body.max_error_rate_increase,
            max_ttft_increase_pct=body.max_ttft_increase_pct,
            min_requests=body.min_requests,
        )
        return start(split, rollout)

    await _change(services, caller, spec, begin, quota=True)
    await services.state.wake(unit_name(name, target))  # the controller warms it now
    return await versions_view(services.state, spec)


@router.post("/{name}/rollout/promote")
async def promote_rollout(name: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    spec = await _owned(services, caller, name)
    now = time.time()
    await _change(services, caller, spec, lambda split: promote(split, now))
    return await versions_view(services.state, spec)


@router.post("/{name}/rollback")
async def rollback_rollout(name: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    spec = await _owned(services, caller, name)
    now = time.time()
    split = await _change(
        services, caller, spec, lambda s: rollback(s, "rolled back by hand", now), quota=True
    )
    if split.rollout is not None:
        await services.state.wake(unit_name(name, split.rollout.from_version))
    return await versions_view(services.state, spec)


@router.delete("/{name}/versions/{version}")
async def delete_version(
    name: str, version: int, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    """Forget a version that takes no traffic and is in no rollout (to stay under the
    versions kept per deployment); its queued jobs move to the serving version."""
    spec = await _owned(services, caller, name)
    store = VersionStore(services.state.redis)
    try:
        split = await store.delete_version(name, version)
    except VersionInUse as e:
        raise Conflict(f"{name!r}: {e}", param="version") from e
    except LookupError as e:
        raise NotFound(
            f"{name!r} has no version {version}; GET /v1/deployments/{name}/versions lists them.",
            param="version",
        ) from e
    await JobMoves(services.state.redis).move_queued(
        unit_name(name, version), unit_name(name, split.primary)
    )
    return {
        "object": "deployment.version.deleted",
        "deployment": spec.name,
        "version": version,
        "deleted": True,
    }
