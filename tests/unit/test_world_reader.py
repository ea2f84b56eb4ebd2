"""The world one reconcile plans from: demand per serving unit, sleepers, dead stems, and
the cluster's nodes (with the caches their prefetchers published) read only when some
deployment may need a start, and never a reason not to start when unreadable."""

from __future__ import annotations

from ebb.coldstart.clock import ManualClock
from ebb.coldstart.launcher import NoWarmStarts
from ebb.coldstart.placement import NodeCapacity
from ebb.coldstart.simulation_state import InMemoryState
from ebb.coldstart.simulation_trace import TraceRequest
from ebb.coldstart.world import Backoff
from ebb.coldstart.world_reader import WorldReader
from ebb.config import Settings
from ebb.queue.schema import DeploymentSpec, EngineSpec, RunnerRecord, RunnerState

SRC = "s3://m/llama"
SPEC = DeploymentSpec(name="m", source=SRC, uid="dep_m", engine=EngineSpec(tensor_parallel_size=2))


class Cluster:
    def __init__(self, nodes: list[NodeCapacity] | Exception):
        self._nodes = nodes
        self.reads = 0

    def nodes(self) -> list[NodeCapacity]:
        self.reads += 1
        if isinstance(self._nodes, Exception):
            raise self._nodes
        return self._nodes


def reader(state: InMemoryState, cluster: Cluster) -> WorldReader:
    return WorldReader(Settings(), state, NoWarmStarts(), pools={}, default_gpus=1, nodes=cluster)


async def test_demand_sleepers_dead_stems_and_nodes_with_their_caches():
    clock = ManualClock()
    state = InMemoryState(clock)
    state.deployments["m"] = SPEC
    state.cached = {"n2": frozenset({SRC})}
    runners = [
        RunnerRecord(runner_id="r-stem", state=RunnerState.PREWARMED),
        RunnerRecord(
            runner_id="r-z",
            state=RunnerState.SLEEPING,
            deployment="m",
            deployment_uid="dep_m",
            ready_ms=1,
        ),  # fmt: skip
        RunnerRecord(
            runner_id="r-old",
            state=RunnerState.SLEEPING,
            deployment="m",
            deployment_uid="dep_earlier",
            ready_ms=1,
        ),  # fmt: skip
    ]
    cluster = Cluster([NodeCapacity("n1", free_gpus=2), NodeCapacity("n2", free_gpus=2)])
    read = reader(state, cluster)

    async def world():
        return await read.read(
            runners,
            now_s=clock.monotonic(),
            alive=lambda runner_id: runner_id != "r-stem",
            backoffs={"m": Backoff(1, 5.0)},
            shown_unschedulable=None,
        )

    idle = await world()
    assert idle.nodes is None and cluster.reads == 0, "no start can be needed: not read"
    [demand] = idle.demands
    assert demand.sleepers == ("r-z",), "an earlier deployment's sleeper is not this one's"
    assert (demand.node_gpus, demand.backoff) == (2, Backoff(1, 5.0))
    assert idle.dead_stems == {"r-stem"}
    state.enqueue("m", TraceRequest(arrival_s=0.0, prompt_tokens=1, output_tokens=1))
    busy = await world()
    assert busy.demands[0].queue_depth == 1
    assert busy.nodes is not None
    assert {n.name: n.cached_sources for n in busy.nodes} == {
        "n1": frozenset(),
        "n2": frozenset({SRC}),
    }
    down = reader(state, Cluster(RuntimeError("API server down")))
    unreadable = await down.read(
        runners, now_s=0.0, alive=lambda r: True, backoffs={}, shown_unschedulable=None
    )
    assert unreadable.nodes is None and unreadable.demands[0].queue_depth == 1


async def test_a_scaling_block_may_start_with_nothing_queued_and_is_measured():
    from ebb.coldstart.scaling_tracker import ScalingTracker
    from ebb.queue.scaling_spec import ScalingSpec

    clock = ManualClock()
    state = InMemoryState(clock)
    state.cold_starts_ms = {"fresh": {"total": 12_000.0}}
    state.deployments["m"] = DeploymentSpec(
        name="m", source=SRC, uid="dep_m", scaling=ScalingSpec(policy="utilisation")
    )
    cluster = Cluster([NodeCapacity("n1", free_gpus=2)])
    read = WorldReader(
        Settings(), state, NoWarmStarts(), pools={}, default_gpus=1, nodes=cluster,
        scaling=ScalingTracker(state),
    )  # fmt: skip
    world = await read.read(
        [], now_s=0.0, alive=lambda _: True, backoffs={}, shown_unschedulable=None, wall_s=5.0
    )
    assert world.nodes is not None, "a schedule or policy may start a runner: nodes read"
    assert world.wall_s == 5.0 and world.demands[0].cold_start_s == 12.0
    assert world.demands[0].measured.utilisation == ((5.0, 0.0),)
