"""The controller's GPU side: this host's inventory, and devices reserved per runner.

Before the controller starts a runner for a deployment (a fresh or forked process, or a
stem from the pool) it asks `reserve`: on a host with GPUs, placement (`placement.place`)
picks the devices from the inventories and the placements of live runners (on a host
whose prefetcher says it holds the weights first), and the runner's `GpuPlacement` is
written before the runner can read it (`commit`). When nothing
fits, the deployment's status says `unschedulable` with the numbers, and the frontdoor
answers its requests with a 503 that says so; every reconcile checks again (`recheck`)
and clears it once a device has room. On hosts without GPUs nothing changes: runners
start on CPU as before. A sleeping runner's device is free for others (it holds only its
CUDA context); before it is woken, `can_wake` checks that its devices still have room.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ebb.coldstart.clock import SYSTEM_CLOCK, Clock
from ebb.coldstart.gpu_need import estimate_need
from ebb.coldstart.inventory import host_name, read_host_inventory
from ebb.coldstart.placement import GpuNeed, Held, Placed, Refused, place
from ebb.coldstart.state import ControllerState
from ebb.config import Settings
from ebb.engines import EngineRegistry
from ebb.queue.gpu_records import GpuPlacement, HostInventory
from ebb.queue.gpus import GpuState
from ebb.queue.schema import DeploymentSpec, RunnerRecord, RunnerState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reservation:
    """Whether to start a runner now, and on which devices (None: on CPU)."""

    launch: bool
    placement: GpuPlacement | None = None


CPU = Reservation(launch=True)
HOLD = Reservation(launch=False)


class GpuPlacer:
    def __init__(
        self,
        settings: Settings,
        state: ControllerState,
        gpus: GpuState,
        *,
        engines: EngineRegistry | None = None,
        clock: Clock = SYSTEM_CLOCK,
        read_inventory: Callable[[Settings], HostInventory] = read_host_inventory,
    ):
        self._settings = settings
        self._state = state
        self._gpus = gpus
        self._engines = engines or EngineRegistry.from_settings(settings)
        self._clock = clock
        self._read_inventory = read_inventory
        self._inventories: list[HostInventory] = []
        self._next_refresh_s = 0.0
        # Deployments shown unschedulable, and why; None until the first recheck.
        self._unschedulable: dict[str, str] | None = None

    @property
    def has_gpus(self) -> bool:
        return any(i.devices for i in self._inventories)

    async def refresh(self) -> None:
        """Publish this host's inventory (at most every `gpu_inventory_interval_s`)."""
        if self._clock.monotonic() < self._next_refresh_s:
            return
        self._next_refresh_s = self._clock.monotonic() + self._settings.gpu_inventory_interval_s
        # NVML calls block for milliseconds per device: off the event loop.
        inventory = await asyncio.to_thread(self._read_inventory, self._settings)
        await self._gpus.put_inventory(inventory)
        self._inventories = await self._gpus.inventories()

    async def reserve(self, spec: DeploymentSpec) -> Reservation:
        """Where one new runner of `spec` goes (see the module docstring)."""
        if not self.has_gpus:
            return CPU
        need = estimate_need(self._settings, self._engines, spec)
        if need is None:
            # Asked again every reconcile until the preparer has published them.
            log.debug("coldstart: %s waits for its weights before it can be placed", spec.name)
            return HOLD
        caches = await self._state.node_caches()
        result = place(
            need,
            self._inventories,
            await self._held(),
            tensor_parallel_size=spec.engine.tensor_parallel_size,
            deployment=spec.name,
            holding={node for node, sources in caches.items() if spec.source in sources},
        )
        if isinstance(result, Refused):
            await self._mark(spec.name, result.reason)
            return HOLD
        await self._mark(spec.name, "")
        return Reservation(True, result.placement if isinstance(result, Placed) else None)

    async def commit(self, runner_id: str, placement: GpuPlacement | None) -> None:
        """Record `placement` as `runner_id`'s, before the runner can look for it."""
        if placement is not None:
            await self._gpus.put_placement(runner_id, placement)

    async def can_wake(self, runner_id: str) -> bool:
        """Whether a sleeping runner's devices have room for it again."""
        placements = await self._gpus.placements()
        own = placements.get(runner_id)
        if own is None:
            return True
        inventory = [
            HostInventory(
                host=i.host, devices=[d for d in i.devices if d.index in own.device_indexes]
            )
            for i in self._inventories
            if i.host == own.host
        ]
        need = GpuNeed(
            weights_bytes=own.reserved_bytes_per_device * own.gpu_count,
            kv_cache_bytes=0,
            reserve_bytes=0,
            model_key=own.model_key,
        )
        held = [h for h in await self._held(placements) if h.placement is not own]
        return isinstance(place(need, inventory, held, tensor_parallel_size=own.gpu_count), Placed)

    async def return_sleeper(self, runner_id: str, deployment: str) -> None:
        await self._gpus.return_sleeper(runner_id, deployment)

    async def gpu_count(self, runner_id: str) -> int:
        """The GPUs a runner is billed for: its placement's, or one."""
        placement = (await self._gpus.placements()).get(runner_id)
        return placement.gpu_count if placement else 1

    async def recheck(self, specs: Iterable[DeploymentSpec]) -> None:
        """Clear `unschedulable` from deployments that fit now (and, on the first call,
        whatever an earlier controller left)."""
        if self._unschedulable is None:
            self._unschedulable = {}
            for spec in specs:
                await self._state.set_deployment_status(spec.name, unschedulable="")
            return
        for spec in list(specs):
            if spec.name in self._unschedulable:
                await self.reserve(spec)

    async def enforce_sleep_budget(self) -> None:
        """Keep this host's sleepers within `sleep_host_ram_bytes` of offloaded weights:
        the newest stay asleep, the older ones beyond the budget are made to exit."""
        budget = self._settings.sleep_host_ram_bytes
        if budget is None:
            return
        placements = await self._gpus.placements()
        here = host_name()
        sleepers = sorted(
            (
                r
                for r in await self._state.runners()
                if _asleep(r) and r.runner_id in placements and placements[r.runner_id].host == here
            ),
            key=lambda r: r.ready_ms,
            reverse=True,
        )
        held_bytes = 0
        for r in sleepers:
            held_bytes += placements[r.runner_id].host_ram_bytes_asleep
            if held_bytes > budget and await self._gpus.evict_sleeper(r.runner_id, r.deployment):
                log.info(
                    "coldstart: sleeping %s (%s) exits: sleepers would hold %d bytes of host "
                    "RAM, over EBB_SLEEP_HOST_RAM_BYTES=%d",
                    r.runner_id,
                    r.deployment,
                    held_bytes,
                    budget,
                )

    async def _mark(self, deployment: str, reason: str) -> None:
        marked = self._unschedulable if self._unschedulable is not None else {}
        self._unschedulable = marked
        if marked.get(deployment, "") == reason:
            return
        if reason:
            marked[deployment] = reason
            log.warning("coldstart: %s is unschedulable: %s", deployment, reason)
        else:
            marked.pop(deployment, None)
        await self._state.set_deployment_status(deployment, unschedulable=reason)

    async def _held(self, placements: dict[str, GpuPlacement] | None = None) -> list[Held]:
        """The placements of live runners; a sleeper not being woken holds only a residue."""
        if placements is None:
            placements = await self._gpus.placements()
        records = {r.runner_id: r for r in await self._state.runners()}
        held = []
        for runner_id, placement in placements.items():
            record = records.get(runner_id)
            if record is not None and not record.state.is_live:
                continue
            held.append(Held(placement, asleep=_asleep(record)))
        return held


def _asleep(record: RunnerRecord | None) -> bool:
    return record is not None and record.state is RunnerState.SLEEPING and not record.is_starting
