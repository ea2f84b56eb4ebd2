"""GET /v1/status: the platform at a glance — the pre-warmed pool, every live runner,
the GPUs of every host (with what each runner reserved on them) and the memory (RSS,
PSS) of every platform process."""

from __future__ import annotations

from fastapi import APIRouter

from ebb.coldstart.placement import ASLEEP_RESIDUAL_BYTES
from ebb.frontdoor.auth import AdminDep
from ebb.frontdoor.services import ServicesDep
from ebb.launching.stem_pools import stems_wanted
from ebb.queue.gpu_records import GpuPlacement, HostInventory
from ebb.queue.gpus import GpuState
from ebb.queue.process_memory import ProcessMemory, read_process_memory
from ebb.queue.schema import RunnerRecord, RunnerState

router = APIRouter(prefix="/v1")


@router.get("/status")
async def platform_status(caller: AdminDep, services: ServicesDep) -> dict:
    state = services.state
    settings = services.settings
    runners = [r for r in await state.runners() if r.state.is_live]
    stems = [r for r in runners if not r.deployment]
    gpus = GpuState(state.redis)
    live = {r.runner_id for r in runners}
    placements = {k: p for k, p in (await gpus.placements()).items() if k in live}
    asleep = {r.runner_id for r in runners if r.state is RunnerState.SLEEPING and not r.is_starting}
    return {
        "object": "platform.status",
        "pool": {
            "target": stems_wanted(settings.stem_pools, prewarm=settings.prewarm),
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
                "gpus": placements[r.runner_id].device_indexes if r.runner_id in placements else [],
            }
            for r in runners
        ],
        "gpus": [_host_view(i, placements, asleep) for i in await gpus.inventories()],
        # Every platform process's memory, as each last reported it (every few seconds).
        "processes": _process_view(await read_process_memory(state.redis), runners),
    }


def _process_view(records: list[ProcessMemory], runners: list[RunnerRecord]) -> list[dict]:
    """One row per process; a runner without a deployment yet is a pre-warmed stem."""
    stems = {r.runner_id for r in runners if not r.deployment}
    return [
        {
            "role": "stem" if p.runner_id in stems else p.role,
            "host": p.host,
            "pid": p.pid,
            "runner_id": p.runner_id or None,
            "rss_bytes": p.rss_bytes,
            "pss_bytes": p.pss_bytes,
            "reported_ms": p.reported_ms,
        }
        for p in records
    ]


def _host_view(
    inventory: HostInventory, placements: dict[str, GpuPlacement], asleep: set[str]
) -> dict:
    """One host's devices; a sleeping runner holds only its CUDA context of its device."""
    here = {k: p for k, p in placements.items() if p.host == inventory.host}

    def reserved(runner_id: str, p: GpuPlacement) -> int:
        return ASLEEP_RESIDUAL_BYTES if runner_id in asleep else p.reserved_bytes_per_device

    return {
        "host": inventory.host,
        "read_at_ms": inventory.read_at_ms,
        "note": inventory.note or None,
        "devices": [
            {
                "index": d.index,
                "uuid": d.uuid,
                "name": d.name,
                "total_bytes": d.total_bytes,
                "free_bytes": d.free_bytes,
                "utilization_pct": d.utilization_pct,
                "temperature_c": d.temperature_c,
                "reserved_bytes": sum(
                    reserved(k, p) for k, p in here.items() if d.index in p.device_indexes
                ),
                "runners": sorted(k for k, p in here.items() if d.index in p.device_indexes),
            }
            for d in inventory.devices
        ],
    }
