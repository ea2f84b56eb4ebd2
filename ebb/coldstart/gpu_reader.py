"""The controller's view of this platform's GPUs, read once per reconcile: this host's
inventory (published at most every `gpu_inventory_interval_s`), every host's, and the
devices each runner holds (`GpuPlacement`, written by the executor before the runner
starts). What goes where is `plan`'s decision (`placement.place`); on hosts without GPUs
there is nothing to place and runners start on CPU.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from ebb.coldstart.clock import SYSTEM_CLOCK, Clock
from ebb.coldstart.inventory import host_name, read_host_inventory
from ebb.coldstart.world import Gpus
from ebb.config import Settings
from ebb.queue.gpu_records import HostInventory
from ebb.queue.gpus import GpuState


class GpuReader:
    def __init__(
        self,
        settings: Settings,
        gpus: GpuState,
        *,
        clock: Clock = SYSTEM_CLOCK,
        read_inventory: Callable[[Settings], HostInventory] = read_host_inventory,
    ):
        self._settings = settings
        self.records = gpus
        self._clock = clock
        self._read_inventory = read_inventory
        self._inventories: list[HostInventory] = []
        self._next_refresh_s = 0.0

    async def read(self, shown_unschedulable: Mapping[str, str] | None) -> Gpus:
        """Every host's devices and every runner's placement, now."""
        await self._refresh()
        return Gpus(
            inventories=tuple(self._inventories),
            placements=await self.records.placements(),
            shown_unschedulable=shown_unschedulable,
            host=host_name(),
            sleep_budget_bytes=self._settings.sleep_host_ram_bytes,
        )

    async def gpu_count(self, runner_id: str) -> int:
        """The GPUs a runner is billed for: its recorded placement's, or one."""
        placement = (await self.records.placements()).get(runner_id)
        return placement.gpu_count if placement else 1

    async def _refresh(self) -> None:
        if self._clock.monotonic() < self._next_refresh_s:
            return
        self._next_refresh_s = self._clock.monotonic() + self._settings.gpu_inventory_interval_s
        # NVML calls block for milliseconds per device: off the event loop.
        inventory = await asyncio.to_thread(self._read_inventory, self._settings)
        await self.records.put_inventory(inventory)
        self._inventories = await self.records.inventories()
