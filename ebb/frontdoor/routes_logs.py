"""GET /v1/logs: the platform's and its runners' log lines, for `ebb logs` (the admin key;
a tenant key: the runners of its own deployments, and the controller's decisions about
them).

The lines come from the log files under EBB_HOME/logs on the frontdoor's host (where
`ebb up` and the local launcher write them). A response's `cursor` continues where it
ended: a follower passes it back and gets only the lines written since.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from fastapi import APIRouter

from ebb.errors import InvalidRequest, NotFound, PermissionDenied
from ebb.frontdoor import tenancy
from ebb.frontdoor.auth import CallerDep
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.services import Services, ServicesDep
from ebb.logtail import (
    PLATFORM_LOGS,
    decisions_log,
    decode_cursor,
    encode_cursor,
    platform_log,
    read_new,
    runner_log,
)
from ebb.queue.versions import public_name

router = APIRouter(prefix="/v1")

_RUNNER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@router.get("/logs")
async def logs(
    caller: CallerDep,
    services: ServicesDep,
    deployment: str | None = None,
    runner: str | None = None,
    since_s: float | None = None,
    cursor: str | None = None,
    tail: int = 100,
) -> dict[str, Any]:
    """Lines of one runner (`runner`), of a deployment's runners (`deployment`: every
    version's, and only the runners of the deployment that has the name now, not of an
    earlier one deleted, and the controller's decisions about it), or of the platform's
    processes (neither)."""
    try:
        offsets = decode_cursor(cursor) if cursor else None
    except ValueError as e:
        raise InvalidRequest(f"{e}; omit it to start from the end", param="cursor") from e
    if not 1 <= tail <= 10_000:
        raise InvalidRequest("tail must be between 1 and 10000 lines", param="tail")
    logs_dir = services.settings.logs_dir
    files = await _files(services, caller, logs_dir, deployment, runner)
    lines, new_offsets = await asyncio.to_thread(
        read_new, files, offsets, tail_lines=tail, since_s=since_s
    )
    # Offsets of the files read now only: a follower's cursor does not grow without bound.
    names = {path.name for path in files}
    kept = {name: offset for name, offset in (offsets or {}).items() if name in names}
    return {
        "object": "list",
        "data": [{"source": line.source, "line": line.text} for line in lines],
        "cursor": encode_cursor({**kept, **new_offsets}),
    }


async def _files(
    services: Services,
    caller: Caller,
    logs_dir: Path,
    deployment: str | None,
    runner: str | None,
) -> list[Path]:
    """The log files the caller asked for and may read: a tenant only those of runners of
    a deployment it manages (404 for others' names and runners)."""
    if runner is not None and not _RUNNER_ID.match(runner):
        raise NotFound(f"No log of runner {runner!r}; 'ebb status' lists the runners.")
    if deployment is None:
        if not caller.is_admin:
            raise PermissionDenied(
                "A tenant key reads the logs of its own deployments only: pass deployment "
                "('ebb logs DEPLOYMENT').",
                param="deployment",
            )
        if runner is None:
            return [platform_log(logs_dir, name) for name in PLATFORM_LOGS]
        return [_existing(logs_dir, runner)]
    uid, runners = await _deployment_runners(services, caller, deployment)
    if runner is None:
        decisions = decisions_log(logs_dir, uid) if uid else None
        return [runner_log(logs_dir, runner_id) for runner_id in runners] + (
            [decisions] if decisions is not None else []
        )
    if runner not in runners:
        raise NotFound(f"No runner {runner!r} of deployment {deployment!r}.", param="runner")
    return [_existing(logs_dir, runner)]


async def _deployment_runners(
    services: Services, caller: Caller, deployment: str
) -> tuple[str, list[str]]:
    """The uid of the deployment that has the name now ("" if none) and the runner ids of
    its every version, launched for it. The admin also reads a deleted deployment's
    runners, by name."""
    if caller.is_admin:
        spec = await services.state.get_deployment(deployment)
    else:
        spec = await tenancy.managed_deployment(services.state, caller, deployment)
    runners = [
        r.runner_id
        for r in await services.state.runners()
        if public_name(r.deployment) == deployment
        and (spec is None or r.deployment_uid == spec.uid)
    ]
    if not runners and spec is None:
        raise NotFound(f"No deployment {deployment!r}; 'ebb deployments' lists them.")
    return (spec.uid if spec is not None else ""), runners


def _existing(logs_dir: Path, runner: str) -> Path:
    path = runner_log(logs_dir, runner)
    if not path.exists():
        raise NotFound(f"No log of runner {runner!r}; 'ebb status' lists the runners.")
    return path
