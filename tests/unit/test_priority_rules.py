"""Priority classes as pure rules: queue scores, which class a request is in, when a
request is shed, which deployment gets the next cold start, and that placement keeps
classes off each other's GPUs."""

from __future__ import annotations

import pytest

from ebb.coldstart.placement import GIB, GpuNeed, Held, Placed, Refused, place
from ebb.coldstart.plan import AssignStem, Launch, plan
from ebb.coldstart.priority import by_urgency
from ebb.coldstart.world import Demand, Gpus, World
from ebb.launching.stem_pools import StemPool
from ebb.queue.gpu_records import GpuDevice, GpuPlacement, HostInventory
from ebb.queue.priority import (
    class_of_score,
    class_score_ranges,
    effective_priority,
    enqueued_ms_of_score,
    score_offset_ms,
    shed_depth,
)
from ebb.queue.schema import DeploymentSpec, RunnerRecord, RunnerState, WorkItem

NOW_MS = 1_780_000_000_000  # 2026
YEAR_MS = 365 * 86400 * 1000


def test_every_critical_request_scores_before_every_standard_and_sheddable_one():
    # A critical request queued a year after a sheddable one is still claimed first.
    critical = NOW_MS + YEAR_MS + score_offset_ms("critical")
    standard = NOW_MS + 1 + score_offset_ms("standard")
    sheddable = NOW_MS + score_offset_ms("sheddable")
    assert critical < standard < sheddable
    # Within a class, the oldest first: the offset is the same for both.
    assert NOW_MS + score_offset_ms("critical") < NOW_MS + 1 + score_offset_ms("critical")


@pytest.mark.parametrize("priority", ["critical", "standard", "sheddable"])
def test_a_score_gives_back_its_class_and_enqueue_time(priority):
    score = NOW_MS + score_offset_ms(priority)
    assert class_of_score(score) == priority
    assert enqueued_ms_of_score(score) == NOW_MS
    ranges = dict(zip(("critical", "standard", "sheddable"), class_score_ranges(), strict=True))
    low, high = ranges[priority]
    assert low <= score < high
    assert score < 2**53  # exact in a double, as Redis keeps scores


def test_a_score_without_an_offset_is_standard():
    """Requests queued before classes existed (and job attempts) keep their plain scores."""
    assert class_of_score(NOW_MS) == "standard"
    assert score_offset_ms("") == score_offset_ms("nonsense") == 0


def test_a_keys_class_overrides_its_tenants_and_the_default_is_standard():
    assert effective_priority("sheddable", "critical") == "sheddable"
    assert effective_priority(None, "critical") == "critical"
    assert effective_priority(None, None) == "standard"
    unset = WorkItem(request_id="r", deployment="d", prompt_token_ids=[], sampling=None)  # type: ignore[arg-type]
    assert unset.priority == "standard"


def test_only_sheddable_work_is_shed_before_the_queue_is_full():
    assert shed_depth("sheddable", 256, 0.5) == 128
    assert shed_depth("sheddable", 3, 0.5) == 1
    assert shed_depth("standard", 256, 0.5) == 0
    assert shed_depth("critical", 256, 0.5) == 0
    assert shed_depth("sheddable", 256, 1.0) == 0  # shed only when full


# --- which deployment gets the next cold start --------------------------------------------


def spec(name: str, priority: str = "standard") -> DeploymentSpec:
    return DeploymentSpec(name=name, source=f"s3://m/{name}", uid=f"uid-{name}", priority=priority)


def demand(name: str, head: str, *, depth: int = 1, wait_s: float = 0.0, **kw: object) -> Demand:
    return Demand(
        spec=spec(name, **kw),  # type: ignore[arg-type]
        queue_depth=depth,
        head_priority=head,
        oldest_wait_s=wait_s,
    )


def test_demands_are_ordered_by_their_most_urgent_waiting_work():
    ordered = by_urgency(
        [
            demand("idle", "", depth=0),
            demand("std-old", "standard", wait_s=9),
            demand("shed", "sheddable", wait_s=20),
            demand("crit", "critical", wait_s=0.1),
            demand("std-new", "standard", wait_s=1),
        ]
    )
    assert [d.name for d in ordered] == ["crit", "std-old", "std-new", "shed", "idle"]


def test_with_one_stem_the_deployment_with_critical_work_waiting_gets_it():
    stem = RunnerRecord(runner_id="stem-1", state=RunnerState.PREWARMED, launched_ms=1)
    the_world = World(
        demands=(demand("standard-first", "standard", wait_s=5), demand("urgent", "critical")),
        runners=(stem,),
        pools={"": StemPool("", 1)},
    )
    actions = plan(the_world)
    [assigned] = [a for a in actions if isinstance(a, AssignStem)]
    assert assigned.deployment == "urgent"
    # The other one still starts, the slower way.
    assert [a.deployment for a in actions if isinstance(a, Launch)] == ["standard-first"]


# --- placement keeps classes apart ---------------------------------------------------------


def host(*free_gib: float) -> HostInventory:
    return HostInventory(
        host="h1",
        devices=[
            GpuDevice(
                index=i, uuid=f"GPU-{i}", name="L4", total_bytes=80 * GIB, free_bytes=int(f * GIB)
            )
            for i, f in enumerate(free_gib)
        ],
    )


def holding(device: int, priority: str, model: str = "s3://m/a") -> Held:
    return Held(
        GpuPlacement(
            host="h1",
            device_indexes=[device],
            reserved_bytes_per_device=8 * GIB,
            gpu_memory_utilization=0.1,
            model_key=model,
            priority=priority,
        )
    )


NEED = GpuNeed(weights_bytes=4 * GIB, kv_cache_bytes=0, reserve_bytes=0, model_key="s3://m/a")


def test_a_runner_is_never_placed_beside_a_runner_of_another_priority():
    # GPU 0 has the tightest fit, but a standard runner uses it: critical goes to GPU 1.
    result = place(NEED, [host(60, 80)], [holding(0, "standard")], priority="critical")
    assert isinstance(result, Placed)
    assert result.placement.device_indexes == [1]
    assert result.placement.priority == "critical"


def test_the_same_priority_still_shares_a_gpu():
    result = place(NEED, [host(60, 80)], [holding(0, "critical")], priority="critical")
    assert isinstance(result, Placed) and result.placement.device_indexes == [0]


def test_a_placement_from_before_classes_counts_as_standard():
    result = place(NEED, [host(60)], [holding(0, "")], priority="standard")
    assert isinstance(result, Placed)
    refused = place(NEED, [host(60)], [holding(0, "")], priority="sheddable")
    assert isinstance(refused, Refused)


def test_no_gpu_free_of_other_classes_refuses_with_the_reason():
    result = place(NEED, [host(60)], [holding(0, "critical")], priority="sheddable")
    assert isinstance(result, Refused)
    assert "priority" in result.reason and "'sheddable'" in result.reason


def test_the_plan_places_a_deployment_by_its_own_priority():
    gpus = Gpus(
        inventories=(host(60, 80),),
        placements={"r-std": holding(0, "standard").placement},
    )
    critical = Demand(
        spec=spec("c", priority="critical"), queue_depth=1, gpu_need=NEED, head_priority="standard"
    )
    actions = plan(World(demands=(critical,), gpus=gpus, pools={}))
    [launch] = [a for a in actions if isinstance(a, Launch)]
    assert launch.gpu is not None and launch.gpu.device_indexes == [1]


# --- the frontdoor's view of a caller's class ----------------------------------------------


class CountingStore:
    def __init__(self) -> None:
        self.reads = 0
        self.priority = "critical"

    async def effective(self, key_id: str, tenant: str) -> str:
        self.reads += 1
        return self.priority


async def test_a_callers_class_is_read_once_a_second_and_again_after_a_change():
    from ebb.frontdoor.priority import AdmissionPriority
    from ebb.queue.schema import SamplingSpec

    now = [0.0]
    store = CountingStore()
    admission = AdmissionPriority(store, 0.5, clock=lambda: now[0])  # type: ignore[arg-type]
    work = WorkItem(
        request_id="r",
        deployment="d",
        prompt_token_ids=[1],
        sampling=SamplingSpec(max_tokens=1),
        key_id="k",
    )
    assert (await admission.stamp(work)).priority == "critical"
    store.priority = "sheddable"
    assert (await admission.stamp(work)).priority == "critical"  # within the second
    now[0] = 1.5
    assert (await admission.stamp(work)).priority == "sheddable"
    store.priority = "standard"
    admission.forget()  # set through this frontdoor
    assert (await admission.stamp(work)).priority == "standard"
    assert store.reads == 3


def test_a_runner_takes_a_quarter_of_its_slots_more_for_critical_work_and_its_engine_fits_them():
    from pathlib import Path

    from ebb.config import Settings
    from ebb.queue.priority import critical_slots
    from ebb.runners.loading import engine_options

    assert [critical_slots(n) for n in (1, 4, 32)] == [1, 1, 8]
    options = engine_options(
        Settings(), DeploymentSpec(name="m", source="s", max_concurrency=32), Path("/m"), 2048, None
    )
    # 32 slots of any class, and places for the 32 + 8 critical requests it takes
    # whatever the slots hold.
    assert options.max_num_seqs == 72


def test_a_full_runner_has_the_same_room_for_critical_work_as_an_idle_one():
    """Standard and sheddable requests holding every slot take none of the critical
    room: 4 slots give 5 critical requests places, whatever else runs."""
    from ebb.queue.priority import critical_room, engine_batch_limit

    batch = engine_batch_limit(4)
    assert batch == 9
    assert critical_room(4, held=0, held_critical=0, batch_limit=batch) == 5  # idle
    assert critical_room(4, held=4, held_critical=0, batch_limit=batch) == 5  # full, none critical
    assert critical_room(4, held=6, held_critical=2, batch_limit=batch) == 3
    assert critical_room(4, held=9, held_critical=5, batch_limit=batch) == 0
    # A batch the deployment set smaller bounds it: no place, no claim.
    assert critical_room(4, held=4, held_critical=0, batch_limit=6) == 2
    assert engine_batch_limit(4, configured=6) == 6
