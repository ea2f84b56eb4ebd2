"""Stem pools: EBB_STEM_POOLS parsed (or refused with the accepted form), a runner's GPUs
from its engine's tensor parallel size, the stem ranking (weights cached on its node,
then the pool sparing the fewest GPUs), and the real controller keeping each pool's count
on an in-memory state with a fake pool launcher."""

from __future__ import annotations

import pytest

from ebb.coldstart.clock import ManualClock
from ebb.coldstart.controller import Controller
from ebb.coldstart.fork_client import Exit
from ebb.coldstart.placement import rank_stems
from ebb.coldstart.simulation_state import InMemoryState
from ebb.config import Settings
from ebb.launching.stem_pools import StemPool, parse_stem_pools, runner_gpus
from ebb.launching.tiers import Tier
from ebb.queue.schema import DeploymentSpec, EngineSpec, RunnerRecord, RunnerState
from ebb.runners.loading import engine_options


def test_pools_parse_from_counts_or_objects_and_default_to_prewarm():
    assert parse_stem_pools('{"b": {"stems": 2, "gpus": 1}, "a": 3}', prewarm=1) == [
        StemPool("a", 3, 0),
        StemPool("b", 2, 1),
    ]
    assert parse_stem_pools("", prewarm=2) == [StemPool("", 2)]
    assert parse_stem_pools("", prewarm=0) == []


@pytest.mark.parametrize(
    "raw", ["[1]", "{bad", '{"a": -1}', '{"a": {"stems": 1, "gpu": 1}}', '{"": 1}', '{"a": true}']
)
def test_bad_pools_are_refused_saying_the_accepted_form(raw):
    with pytest.raises(ValueError, match="EBB_STEM_POOLS"):
        parse_stem_pools(raw, prewarm=1)
    with pytest.raises(ValueError, match="EBB_STEM_POOLS"):
        Settings(stem_pools=raw)


def test_a_runner_asks_for_its_engines_tensor_parallel_size_else_the_default():
    tp4 = DeploymentSpec(name="m", source="s", engine=EngineSpec(tensor_parallel_size=4))
    assert runner_gpus(tp4, default=1) == 4
    assert runner_gpus(DeploymentSpec(name="m", source="s"), default=1) == 1
    assert runner_gpus(None, default=1) == 0


def test_without_a_placement_the_engine_runs_the_deployments_tensor_parallel_size(tmp_path):
    # A pod or an actor given its GPUs by the cluster: no local placement, TP from the spec.
    tp2 = DeploymentSpec(name="m", source="s", engine=EngineSpec(tensor_parallel_size=2))
    assert engine_options(Settings(home=tmp_path), tp2, None, 512, None).tensor_parallel_size == 2
    plain = DeploymentSpec(name="m", source="s")
    assert engine_options(Settings(home=tmp_path), plain, None, 512, None).tensor_parallel_size == 1


def stem(runner_id: str, pool: str, node: str, launched_ms: int = 0) -> RunnerRecord:
    return RunnerRecord(
        runner_id=runner_id,
        state=RunnerState.PREWARMED,
        pool=pool,
        node=node,
        launched_ms=launched_ms,
    )


def test_stems_rank_by_cached_weights_then_fewest_spare_gpus_and_never_too_few():
    pools = {
        p.name: p
        for p in parse_stem_pools(
            '{"g1": {"stems": 1, "gpus": 1}, "g4": {"stems": 1, "gpus": 4}, "cpu": 1}', prewarm=0
        )
    }
    stems = [
        stem("r-g4-cached", "g4", "big", launched_ms=3),
        stem("r-g1", "g1", "small", launched_ms=1),
        stem("r-g4", "g4", "big2", launched_ms=2),
        stem("r-cpu", "cpu", "c", launched_ms=0),
        RunnerRecord(runner_id="r-busy", state=RunnerState.LOADING, pool="g4", node="big"),
    ]
    cached = {"big": frozenset({"s3://m"})}
    assert rank_stems(stems, pools, "s3://m", 1, cached) == ["r-g4-cached", "r-g1", "r-g4"]
    assert rank_stems(stems, pools, "s3://other", 1, cached) == ["r-g1", "r-g4", "r-g4-cached"]
    assert rank_stems(stems, pools, "s3://m", 0, {}) == ["r-cpu", "r-g1", "r-g4", "r-g4-cached"]
    # The default pool's stems get their devices when assigned (local placement): any need.
    assert rank_stems([stem("r-local", "", "h")], {}, "s3://m", 8, {}) == ["r-local"]


class PoolLauncher:
    """Launches nothing; records which pool each stem was asked for."""

    def __init__(self) -> None:
        self.stems: dict[str, str] = {}
        self.exits: list[Exit] = []

    def launch(self, runner_id: str, deployment: str | None, tier: Tier) -> None:
        raise AssertionError("pool stems go through launch_stem")

    def launch_stem(self, runner_id: str, pool: StemPool) -> None:
        self.stems[runner_id] = pool.name

    def poll(self) -> list[Exit]:
        exits, self.exits = self.exits, []
        return exits

    def alive(self, runner_id: str) -> bool:
        return runner_id in self.stems

    def stop_all(self, grace_s: float) -> None:
        self.stems.clear()


async def test_the_controller_keeps_each_pools_count_and_refills_the_pool_a_stem_left():
    state = InMemoryState(ManualClock())
    launcher = PoolLauncher()
    # As on Kubernetes with EBB_K8S_GPUS_PER_RUNNER=1: a runner needs one GPU.
    settings = Settings(
        stem_pools='{"a": {"stems": 2, "gpus": 1}, "b": 1}',
        fork_server=False,
        launcher="kubernetes",
        k8s_gpus_per_runner=1,
    )
    controller = Controller(settings, state, launcher, clock=state.clock)
    await controller.reconcile()
    await controller.reconcile()
    assert sorted(launcher.stems.values()) == ["a", "a", "b"]
    assert {r.runner_id: r.pool for r in state.records.values()} == launcher.stems
    for runner_id in launcher.stems:
        state.join_pool(runner_id)
    # A deployment needing one GPU takes a stem of pool "a" (b's stems hold none).
    state.deployments["m"] = DeploymentSpec(name="m", source="s3://m", min_replicas=1)
    await controller.reconcile()
    [taken] = [r for r in state.records.values() if r.deployment == "m"]
    assert taken.pool == "a" and taken.assigned_ms
    # Pools refill once no runner is starting for real work (its cores are busy).
    state.update_runner(taken.runner_id, state=RunnerState.READY, ready_ms=1)
    await controller.reconcile()
    waiting = [r.pool for r in state.records.values() if not r.deployment and r.state.is_live]
    assert sorted(waiting) == ["a", "a", "b"], "pool a refilled once its stem left"


def test_named_pools_need_a_launcher_that_has_them():
    state = InMemoryState(ManualClock())

    class Local:
        def launch(self, runner_id: str, deployment: str | None, tier: Tier) -> None: ...
        def poll(self) -> list[Exit]:
            return []

        def alive(self, runner_id: str) -> bool:
            return False

        def stop_all(self, grace_s: float) -> None: ...

    with pytest.raises(ValueError, match="EBB_LAUNCHER=kubernetes or ray"):
        Controller(Settings(stem_pools='{"a": 1}'), state, Local())
