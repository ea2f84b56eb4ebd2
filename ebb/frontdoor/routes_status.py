"""GET /v1/status: the platform at a glance — the pre-warmed pool and every live runner."""

from __future__ import annotations

from fastapi import APIRouter

from ebb.frontdoor.auth import AdminDep
from ebb.frontdoor.services import ServicesDep
from ebb.queue.schema import RunnerState

router = APIRouter(prefix="/v1")


@router.get("/status")
async def platform_status(caller: AdminDep, services: ServicesDep) -> dict:
    state = services.state
    runners = [r for r in await state.runners() if r.state.is_live]
    stems = [r for r in runners if not r.deployment]
    return {
        "object": "platform.status",
        "pool": {
            "target": services.settings.prewarm,
            "prewarmed": sum(r.state is RunnerState.PREWARMED for r in stems),
            "starting": sum(r.state is RunnerState.STARTING for r in stems),
        },
        # Runners beyond the pool are forked from it when "ready" (EBB_FORK_SERVER).
        "fork_server": await state.fork_server_state(),
        # Flat over time once past the retention windows (results, jobs, raw usage).
        "redis": await state.memory(),
        "runners": [
            {
                "id": r.runner_id,
                "deployment": r.deployment or None,
                "state": r.state.value,
                "tier": r.tier,
                "pid": r.pid,
                "launched_ms": r.launched_ms,
            }
            for r in runners
        ],
    }
