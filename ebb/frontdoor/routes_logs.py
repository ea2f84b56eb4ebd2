"""GET /v1/logs: the platform's and its runners' log lines, for `ebb logs` (the admin key;
a tenant key: the runners of its own deployments).

The lines come from the log files under EBB_HOME/logs on the frontdoor's host (where
`ebb up` and the local launcher write them). A response's `cursor` continues where it
ended: a follower passes it back and gets only the lines written since.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from fastapi import APIRouter

from ebb.errors import InvalidRequest, NotFound, PermissionDenied
from ebb.frontdoor import tenancy
from ebb.frontdoor.auth import CallerDep
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.services import Services, ServicesDep
from ebb.logtail import (
    PLATFORM_LOGS,
    decode_cursor,
    encode_cursor,
    platform_log,
    read_new,
    runner_log,
)

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
) -> dict:
    """Lines of one runner (`runner`), of a deployment's runners (`deployment`), or of the
    platform's processes (neither)."""
    await _check_access(services, caller, deployment, runner)
    logs_dir = services.settings.logs_dir
    files = await _files(services, logs_dir, deployment, runner)
    try:
        offsets = decode_cursor(cursor) if cursor else None
    except ValueError as e:
        raise InvalidRequest(f"{e}; omit it to start from the end", param="cursor") from e
    if not 1 <= tail <= 10_000:
        raise InvalidRequest("tail must be between 1 and 10000 lines", param="tail")
    lines, new_offsets = await asyncio.to_thread(
        read_new, files, offsets, tail_lines=tail, since_s=since_s
    )
    return {
        "object": "list",
        "data": [{"source": line.source, "line": line.text} for line in lines],
        "cursor": encode_cursor({**(offsets or {}), **new_offsets}),
    }


async def _check_access(
    services: Services, caller: Caller, deployment: str | None, runner: str | None
) -> None:
    """A tenant reads only the runners of a deployment it owns (404 for others' names)."""
    if caller.is_admin:
        return
    if deployment is None:
        raise PermissionDenied(
            "A tenant key reads the logs of its own deployments only: pass deployment "
            "('ebb logs DEPLOYMENT').",
            param="deployment",
        )
    await tenancy.managed_deployment(services.state, caller, deployment)
    if runner is not None:
        runners = {
            r.runner_id for r in await services.state.runners() if r.deployment == deployment
        }
        if runner not in runners:
            raise NotFound(f"No runner {runner!r} of deployment {deployment!r}.", param="runner")


async def _files(
    services: Services, logs_dir: Path, deployment: str | None, runner: str | None
) -> list[Path]:
    if runner is not None:
        if not _RUNNER_ID.match(runner) or not runner_log(logs_dir, runner).exists():
            raise NotFound(f"No log of runner {runner!r}; 'ebb status' lists the runners.")
        return [runner_log(logs_dir, runner)]
    if deployment is not None:
        runners = [r for r in await services.state.runners() if r.deployment == deployment]
        if not runners and await services.state.get_deployment(deployment) is None:
            raise NotFound(f"No deployment {deployment!r}; 'ebb deployments' lists them.")
        return [runner_log(logs_dir, r.runner_id) for r in runners]
    return [platform_log(logs_dir, name) for name in PLATFORM_LOGS]
