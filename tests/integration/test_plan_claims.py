"""The executor applies plans through the platform's real claims (Lua and atomic set
operations on a real Redis): two plans made from the same snapshot — a leader and the
one it lost its lease to — never hand one stem or one sleeper work twice."""

from __future__ import annotations

import asyncio

import redis

from ebb.coldstart.clock import SYSTEM_CLOCK
from ebb.coldstart.executor import Executor
from ebb.coldstart.plan import AssignStem, WakeSleeper, plan
from ebb.coldstart.world import Demand, World
from ebb.launching.tiers import Tier
from ebb.queue import keys
from ebb.queue.connection import async_client
from ebb.queue.gpus import GpuState
from ebb.queue.platform import PlatformState
from ebb.queue.runner_side import RunnerQueue
from ebb.queue.scaling_spec import QUEUE_ONLY
from ebb.queue.schema import DeploymentSpec, RunnerRecord, RunnerState

# The queue rule's own plans: on the queue-only block, which logs no `Scaled` decision.
SPEC = DeploymentSpec(name="m", source="fake://m", uid="dep_m", scaling=QUEUE_ONLY)


class NoLaunches:
    def launch(self, runner_id: str, deployment: str | None, tier: Tier) -> None:
        raise AssertionError("a claim, not a launch, was planned")

    def poll(self) -> list[object]:
        return []

    def alive(self, runner_id: str) -> bool:
        return True

    def stop_all(self, grace_s: float) -> None:
        pass


def side(sync: redis.Redis, runner_id: str) -> RunnerQueue:
    return RunnerQueue(sync, runner_id, lease_ttl_s=5, result_ttl_s=60)


async def test_two_plans_of_one_snapshot_assign_a_stem_once(redis_url):
    sync = redis.Redis.from_url(redis_url)
    state = PlatformState(async_client(redis_url))
    stem = RunnerRecord(runner_id="r-stem", state=RunnerState.PREWARMED)
    await state.put_runner(stem)
    side(sync, "r-stem").offer_as_stem()
    world = World(demands=(Demand(spec=SPEC, queue_depth=1),), runners=(stem,), pools={})
    decided = plan(world)
    assert decided == [AssignStem("r-stem", "m", "dep_m")]
    leaders = [Executor(state, NoLaunches(), SYSTEM_CLOCK) for _ in range(2)]
    made = await asyncio.gather(*(e.apply(decided) for e in leaders))
    assert sorted(len(m) for m in made) == [0, 1], "one claim holds, the other finds none"
    assert side(sync, "r-stem").wait_for_assignment(timeout_s=1) == "m"
    assert side(sync, "r-stem").wait_for_assignment(timeout_s=0.1) is None, "assigned once"
    await state.redis.aclose()
    sync.close()


async def test_a_wake_takes_a_candidate_and_puts_the_others_back_to_sleep(redis_url):
    sync = redis.Redis.from_url(redis_url)
    client = async_client(redis_url)
    state = PlatformState(client)
    for runner_id in ("r-full", "r-roomy"):
        await state.put_runner(
            RunnerRecord(
                runner_id=runner_id,
                state=RunnerState.SLEEPING,
                deployment="m",
                deployment_uid="dep_m",
                ready_ms=1,
            )
        )
        sync.sadd(keys.sleepers("m"), runner_id)
    executor = Executor(state, NoLaunches(), SYSTEM_CLOCK, gpus=GpuState(client))
    # Only r-roomy's devices have room (the plan's word); SPOP may offer r-full first.
    [made] = await executor.apply([WakeSleeper("m", "dep_m", ("r-roomy",))])
    assert isinstance(made, WakeSleeper)
    records = {r.runner_id: r for r in await state.runners()}
    assert records["r-roomy"].woken_ms > 0 and records["r-full"].woken_ms == 0
    assert {m.decode() for m in sync.smembers(keys.sleepers("m"))} == {"r-full"}
    # A sleeper that left (idled out) before the claim is never woken.
    assert side(sync, "r-full").leave_sleepers("m")
    assert await executor.apply([WakeSleeper("m", "dep_m", ("r-full",))]) == []
    await client.aclose()
    sync.close()
