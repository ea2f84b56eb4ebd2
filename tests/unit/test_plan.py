"""The controller's decisions as data: `plan(world)` for hand-built worlds, compared with
the exact actions expected. Nothing here runs a controller, a launcher or Redis."""

from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest

from ebb.coldstart.placement import GIB, GpuNeed, NodeCapacity, Placement
from ebb.coldstart.plan import (
    AssignStem,
    ClearBackoff,
    Drain,
    DropStem,
    Launch,
    MarkUnschedulable,
    WakeSleeper,
    plan,
)
from ebb.coldstart.world import Backoff, Demand, Gpus, World
from ebb.launching.stem_pools import StemPool
from ebb.launching.tiers import Tier, WarmState
from ebb.queue.gpu_records import GpuDevice, GpuPlacement, HostInventory
from ebb.queue.scaling_spec import QUEUE_ONLY
from ebb.queue.schema import DeploymentSpec, EngineSpec, RunnerRecord, RunnerState

SRC = "s3://models/llama"
# The queue rule's own plans: on the queue-only block, which logs no `Scaled` decision.
SPEC = DeploymentSpec(
    name="m", source=SRC, uid="dep_1", max_replicas=4, max_concurrency=8, scaling=QUEUE_ONLY
)
DEFAULT = {"": StemPool("", 1)}


def stem(runner_id: str, *, node: str = "", pool: str = "", launched_ms: int = 1) -> RunnerRecord:
    return RunnerRecord(
        runner_id=runner_id,
        state=RunnerState.PREWARMED,
        node=node,
        pool=pool,
        launched_ms=launched_ms,
    )


def runner(runner_id: str, state: RunnerState, **kw: object) -> RunnerRecord:
    return RunnerRecord(
        runner_id=runner_id, state=state, deployment="m", deployment_uid="dep_1", **kw
    )  # type: ignore[arg-type]


def world(*demands: Demand, **kw: object) -> World:
    kw.setdefault("pools", DEFAULT)
    return World(demands=demands, **kw)  # type: ignore[arg-type]


def queued(n: int = 1, **kw: object) -> Demand:
    return Demand(spec=SPEC, queue_depth=n, **kw)  # type: ignore[arg-type]


def gpu_host(*free_gib: float, total_gib: float = 24) -> HostInventory:
    devices = [
        GpuDevice(
            index=i,
            uuid=f"GPU-{i}",
            name="L4",
            total_bytes=int(total_gib * GIB),
            free_bytes=int(free * GIB),
        )
        for i, free in enumerate(free_gib)
    ]
    return HostInventory(host="h1", devices=devices)


def need(gib: float) -> GpuNeed:
    return GpuNeed(weights_bytes=int(gib * GIB), kv_cache_bytes=0, reserve_bytes=0, model_key=SRC)


@pytest.mark.parametrize(
    ("the_world", "expected"),
    [
        pytest.param(
            world(queued(), runners=(stem("r-stem"),)),
            [AssignStem("r-stem", "m", "dep_1")],
            id="stem",
        ),
        pytest.param(
            world(queued(sleepers=("r-z",)), runners=(stem("r-stem"),)),
            [WakeSleeper("m", "dep_1", ("r-z",))],
            id="sleeper-before-stem",
        ),
        pytest.param(
            world(queued(), pools={}, warm=WarmState.READY),
            [Launch(Tier.FORKED, "m", "dep_1")],
            id="forked-while-the-fork-server-is-up",
        ),
        pytest.param(
            world(queued(), pools={}), [Launch(Tier.FRESH, "m", "dep_1")], id="else-fresh"
        ),
        pytest.param(
            world(queued(backoff=Backoff(2, next_try_s=10.0)), pools={}, now_s=9.0),
            [],
            id="backoff-window",
        ),
        pytest.param(
            world(queued(backoff=Backoff(2, next_try_s=10.0)), pools={}, now_s=10.0),
            [Launch(Tier.FRESH, "m", "dep_1")],
            id="backoff-over",
        ),
        pytest.param(
            world(queued(ready=1, backoff=Backoff(3, next_try_s=99.0)), pools={}, now_s=0.0),
            [ClearBackoff("m")],
            id="a-ready-runner-clears-backoff",
        ),
        pytest.param(
            world(Demand(spec=SPEC)), [Launch(Tier.PREWARMED, pool=StemPool("", 1))], id="refill"
        ),
        pytest.param(
            world(Demand(spec=msgspec.structs.replace(SPEC, min_replicas=2)), pools={}),
            [Launch(Tier.FRESH, "m", "dep_1")] * 2,
            id="min-replicas-without-demand",
        ),
        pytest.param(
            world(queued(20), pools={}),
            [Launch(Tier.FRESH, "m", "dep_1")] * 3,
            id="cold-start-fast-path-for-the-whole-queue",
        ),
    ],
)
def test_decisions(the_world: World, expected: list[object]) -> None:
    assert plan(the_world) == expected


def test_the_pool_is_not_refilled_while_a_runner_loads_for_work_or_the_fork_server_imports():
    loading = world(Demand(spec=SPEC, starting=1), runners=(runner("r-1", RunnerState.LOADING),))
    importing = world(Demand(spec=SPEC), warm=WarmState.STARTING)
    assert plan(loading) == plan(importing) == []


def test_stems_are_ranked_by_the_weights_their_node_holds_then_age():
    stems = (stem("r-old", node="n1", launched_ms=1), stem("r-new", node="n2", launched_ms=2))
    holding = world(queued(9), runners=stems, node_caches={"n2": frozenset({SRC})})
    assert plan(holding) == [AssignStem("r-new", "m", "dep_1"), AssignStem("r-old", "m", "dep_1")]
    assert plan(world(queued(), runners=stems))[0] == AssignStem("r-old", "m", "dep_1")


def test_a_dead_stem_is_dropped_never_handed_work_and_the_next_one_goes():
    stems = (stem("r-dead", launched_ms=1), stem("r-live", launched_ms=2))
    assert plan(world(queued(), runners=stems, dead_stems=frozenset({"r-dead"}))) == [
        DropStem("r-dead"),
        AssignStem("r-live", "m", "dep_1"),
    ]


def test_a_pool_stem_too_small_for_the_deployment_is_passed_over():
    pools = {"cpu": StemPool("cpu", 1), "a100": StemPool("a100", 1, gpus=2)}
    tp2 = msgspec.structs.replace(SPEC, engine=EngineSpec(tensor_parallel_size=2))
    stems = (stem("r-cpu", pool="cpu"), stem("r-gpu", pool="a100", launched_ms=5))
    demand = Demand(spec=tp2, queue_depth=1, node_gpus=2)
    assert plan(world(demand, runners=stems, pools=pools)) == [AssignStem("r-gpu", "m", "dep_1")]


def test_a_new_runner_prefers_the_node_holding_its_weights_and_each_start_sees_the_last():
    nodes = (
        NodeCapacity("roomy", free_gpus=8),
        NodeCapacity("has-llama", free_gpus=1, cached_sources=frozenset({SRC})),
    )
    decided = plan(world(replace(queued(9), node_gpus=1), pools={}, nodes=nodes))
    assert [a.placement for a in decided if isinstance(a, Launch)] == [
        Placement("has-llama", (0,)),
        Placement("roomy", (0,)),  # has-llama's one GPU went to the first
    ]
    nowhere = plan(world(replace(queued(), node_gpus=1), pools={}, nodes=()))
    assert nowhere == [Launch(Tier.FRESH, "m", "dep_1", gpus=1)]


def gpus(*free_gib: float, **kw: object) -> Gpus:
    kw.setdefault("shown_unschedulable", {})
    return Gpus(inventories=(gpu_host(*free_gib),), **kw)  # type: ignore[arg-type]


def test_on_gpus_each_runner_gets_devices_and_the_next_one_sees_them_taken():
    decided = plan(world(queued(9, gpu_need=need(12)), pools={}, gpus=gpus(24)))
    first = decided[0]
    assert isinstance(first, Launch) and first.gpu is not None
    assert first.gpu.device_indexes == [0] and first.gpu.deployment == "m"
    [mark] = decided[1:]
    assert isinstance(mark, MarkUnschedulable) and mark.reason.startswith("needs 12.0 GiB + 20 %")


def test_a_full_gpu_marks_unschedulable_once_launches_nothing_and_clears_when_it_fits():
    full = plan(world(queued(gpu_need=need(30)), pools={}, gpus=gpus(24)))
    assert [type(a) for a in full] == [MarkUnschedulable]
    shown = {"m": full[0].reason}  # type: ignore[union-attr]
    assert (
        plan(world(queued(gpu_need=need(30)), pools={}, gpus=gpus(24, shown_unschedulable=shown)))
        == []
    )
    idle = Demand(spec=SPEC, gpu_need=need(10))
    assert plan(world(idle, pools={}, gpus=gpus(24, shown_unschedulable=shown))) == [
        MarkUnschedulable("m", "")
    ]


def test_weights_not_prepared_yet_hold_the_start_without_a_mark():
    assert plan(world(queued(gpu_need=None), pools={}, gpus=gpus(24))) == []


def test_a_controllers_first_plan_clears_what_an_earlier_one_showed():
    assert plan(world(Demand(spec=SPEC), pools={}, gpus=gpus(24, shown_unschedulable=None))) == [
        MarkUnschedulable("m", "")
    ]


def asleep_on(device: int, gib: float) -> GpuPlacement:
    return GpuPlacement(
        host="h1",
        device_indexes=[device],
        reserved_bytes_per_device=int(gib * GIB),
        gpu_memory_utilization=0.5,
        model_key=SRC,
        deployment="m",
        host_ram_bytes_asleep=int(gib * GIB),
    )


def test_a_sleeper_whose_device_filled_up_stays_asleep_and_another_runner_starts():
    sleeper = runner("r-z", RunnerState.SLEEPING, ready_ms=5)
    view = gpus(4, 24, placements={"r-z": asleep_on(0, 10)})
    decided = plan(
        world(queued(sleepers=("r-z",), gpu_need=need(10)), runners=(sleeper,), pools={}, gpus=view)
    )
    [launch] = decided
    assert (
        isinstance(launch, Launch) and launch.gpu is not None and launch.gpu.device_indexes == [1]
    )
    roomy = gpus(24, placements={"r-z": asleep_on(0, 10)})
    woken = plan(
        world(
            queued(sleepers=("r-z",), gpu_need=need(10)), runners=(sleeper,), pools={}, gpus=roomy
        )
    )
    assert woken == [WakeSleeper("m", "dep_1", ("r-z",))]


def test_sleepers_beyond_the_hosts_ram_budget_drain_oldest_first():
    sleepers = tuple(runner(f"r-{i}", RunnerState.SLEEPING, ready_ms=i) for i in (1, 2, 3))
    view = gpus(
        24,
        host="h1",
        sleep_budget_bytes=int(20 * GIB),
        placements={f"r-{i}": asleep_on(0, 8) for i in (1, 2, 3)},
    )
    decided = plan(world(Demand(spec=SPEC), runners=sleepers, pools={}, gpus=view))
    assert [(a.runner_id, a.deployment) for a in decided if isinstance(a, Drain)] == [("r-1", "m")]
