"""One plan's account of this platform's GPUs (`GpuLedger`): what live runners hold, and
what the plan's own earlier decisions reserved or woke, so that its next decision sees
them. Pure: it reads a `world.Gpus` and changes only itself."""

from __future__ import annotations

from collections.abc import Iterable

from ebb.coldstart.placement import GpuNeed, Held, Placed, place
from ebb.coldstart.world import Gpus
from ebb.queue.gpu_records import GpuPlacement, HostInventory
from ebb.queue.schema import RunnerRecord, RunnerState


class GpuLedger:
    def __init__(self, gpus: Gpus, runners: Iterable[RunnerRecord]):
        self._gpus = gpus
        self._records = {r.runner_id: r for r in runners}
        self._woken: set[str] = set()
        self._reserved: list[GpuPlacement] = []

    @property
    def present(self) -> bool:
        return self._gpus.present

    @property
    def inventories(self) -> list[HostInventory]:
        return list(self._gpus.inventories)

    def held(self, *, besides: str = "") -> list[Held]:
        """The placements of live runners (a record not read counts as live) and of this
        plan's reservations; a sleeper not being woken holds only a residue."""
        held = []
        for runner_id, placement in self._gpus.placements.items():
            record = self._records.get(runner_id)
            if runner_id == besides or (record is not None and not record.state.is_live):
                continue
            held.append(Held(placement, asleep=self._asleep(runner_id)))
        return held + [Held(p) for p in self._reserved]

    def reserve(self, placement: GpuPlacement) -> None:
        self._reserved.append(placement)

    def wake(self, runner_id: str) -> None:
        self._woken.add(runner_id)

    def can_wake(self, runner_id: str) -> bool:
        """Whether a sleeping runner's devices have room for it again."""
        own = self._gpus.placements.get(runner_id)
        if own is None:
            return True
        inventory = [
            HostInventory(
                host=i.host, devices=[d for d in i.devices if d.index in own.device_indexes]
            )
            for i in self._gpus.inventories
            if i.host == own.host
        ]
        need = GpuNeed(
            weights_bytes=own.reserved_bytes_per_device * own.gpu_count,
            kv_cache_bytes=0,
            reserve_bytes=0,
            model_key=own.model_key,
        )
        held = self.held(besides=runner_id)
        placed = place(
            need, inventory, held, tensor_parallel_size=own.gpu_count, priority=own.priority
        )
        return isinstance(placed, Placed)

    def over_sleep_budget(self) -> list[tuple[str, str, str]]:
        """(runner, deployment, why) of this host's sleepers beyond its RAM budget for
        their offloaded weights: the newest stay asleep, the older ones exit."""
        budget = self._gpus.sleep_budget_bytes
        if budget is None:
            return []
        placements = self._gpus.placements
        sleepers = sorted(
            (
                r
                for r in self._records.values()
                if self._asleep(r.runner_id)
                and r.runner_id in placements
                and placements[r.runner_id].host == self._gpus.host
            ),
            key=lambda r: r.ready_ms,
            reverse=True,
        )
        drained = []
        held_bytes = 0
        for r in sleepers:
            held_bytes += placements[r.runner_id].host_ram_bytes_asleep
            if held_bytes > budget:
                why = (
                    f"sleepers would hold {held_bytes} bytes of host RAM, over "
                    f"EBB_SLEEP_HOST_RAM_BYTES={budget}"
                )
                drained.append((r.runner_id, r.deployment, why))
        return drained

    def _asleep(self, runner_id: str) -> bool:
        record = self._records.get(runner_id)
        return (
            runner_id not in self._woken
            and record is not None
            and record.state is RunnerState.SLEEPING
            and not record.is_starting
        )
