"""The simulator's claim rules against the platform's own, on a real redis-server.

`InMemoryState` (ebb/coldstart/simulation_state.py) mirrors in Python the steps the
platform takes in Redis: taking a stem or a sleeper (`PlatformState.take_stem`,
`take_sleeper`: SPOP/SREM), waking and assigning, try_drain.lua and try_sleep.lua's
guard, enqueue.lua's wake, leaving the pool, the serving count. Each case here builds the
same scenario in both worlds, takes the same step in each and asserts the same result and
the same runners, pool and sleepers afterwards, so a mirror cannot drift from its
original unnoticed. Where Redis picks at random (SPOP), a case either has one possible
answer or compares what every order agrees on (see `Observed.agreed`).

What the mirror leaves out on purpose, and this test does not compare: the wall-clock
timestamps (the mirror stamps the simulated clock's), the assignment list a runner blocks
on (simulated runners read their record), the exit a sleeper of another uid is told (the
simulation never re-creates a deployment), and the deployment's claiming marker
(simulated runners claim without one; enqueue's wake is compared only as "the mirror
wakes whenever enqueue.lua does").
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import redis

from ebb.coldstart.clock import ManualClock
from ebb.coldstart.simulation_state import InMemoryState
from ebb.coldstart.simulation_trace import TraceRequest
from ebb.queue import keys
from ebb.queue.connection import async_client, sync_client
from ebb.queue.platform import PlatformState
from ebb.queue.requests import RequestQueue
from ebb.queue.runner_side import RunnerQueue
from ebb.queue.schema import RunnerRecord, RunnerState, SamplingSpec, WorkItem

pytestmark = pytest.mark.integration

DEP = "dep-a"
MINE, OTHER = "dep_mine", "dep_other"  # the deployment's uid, and an earlier one's
S = RunnerState


@dataclass(frozen=True)
class Scenario:
    """Runners (id, state, deployment, uid); which of them joined the pool and which went
    to sleep for DEP (each then moved to its listed state, as a stem that died or a
    sleeper woken since would be); what waits in DEP's queues."""

    runners: tuple[tuple[str, RunnerState, str, str], ...]
    stems: tuple[str, ...] = ()
    sleepers: tuple[str, ...] = ()
    requests: int = 0
    jobs: int = 0


@dataclass(frozen=True)
class Observed:
    result: object
    runners: dict[str, tuple[str, str, str, bool, bool]] = field(default_factory=dict)
    pool: frozenset[str] = frozenset()
    sleepers: frozenset[str] = frozenset()
    depth: tuple[int, int] = (0, 0)

    def agreed(self, eligible: frozenset[str]) -> Observed:
        """What every SPOP order leads to when at most one runner can be taken: the one
        taken (or None) and the eligible ones left; which ineligible ones a lucky order
        skipped is chance (all are dropped when none was eligible: compared in full)."""
        if self.result is None:
            return self
        return replace(self, pool=self.pool & eligible, sleepers=self.sleepers & eligible)


class World:
    """One side: the same steps, each as the simulator or the platform takes it."""

    async def setup(self, scenario: Scenario) -> None:
        for runner_id, state, deployment, uid in scenario.runners:
            await self.put(
                RunnerRecord(
                    runner_id=runner_id,
                    state=state,
                    deployment=deployment,
                    deployment_uid=uid,
                )
            )
        for runner_id in scenario.stems:
            await self.join_pool(runner_id)
        for runner_id in scenario.sleepers:
            assert await self.try_sleep(runner_id)
        for runner_id, state, *_ in scenario.runners:
            await self.set_state(runner_id, state)
        for i in range(scenario.requests):
            await self.enqueue(i)
        await self.queue_jobs(scenario.jobs)

    async def put(self, record: RunnerRecord) -> None: ...
    async def join_pool(self, runner_id: str) -> None: ...
    async def set_state(self, runner_id: str, state: RunnerState) -> None: ...
    async def enqueue(self, i: int) -> bool: ...  # True when the controller was woken
    async def queue_jobs(self, count: int) -> None: ...
    async def try_sleep(self, runner_id: str) -> bool: ...
    async def try_drain(self, runner_id: str) -> bool: ...
    async def serving_runner_count(self) -> int: ...
    async def observe(self, result: object) -> Observed: ...


class Mirror(World):
    def __init__(self) -> None:
        self.state = InMemoryState(ManualClock())

    async def put(self, record: RunnerRecord) -> None:
        await self.state.put_runner(record)

    async def join_pool(self, runner_id: str) -> None:
        self.state.join_pool(runner_id)

    async def set_state(self, runner_id: str, state: RunnerState) -> None:
        self.state.update_runner(runner_id, state=state)

    async def enqueue(self, i: int) -> bool:
        self.state.take_wakes()
        self.state.enqueue(DEP, TraceRequest(arrival_s=0.0, prompt_tokens=3, output_tokens=4))
        return DEP in self.state.take_wakes()

    async def queue_jobs(self, count: int) -> None:
        self.state.job_depth[DEP] += count

    async def try_sleep(self, runner_id: str) -> bool:
        return self.state.try_sleep(DEP, runner_id)

    async def try_drain(self, runner_id: str) -> bool:
        return self.state.try_drain(DEP, runner_id)

    async def serving_runner_count(self) -> int:
        return self.state.serving_runner_count(DEP)

    async def observe(self, result: object) -> Observed:
        snapshot = await self.state.queue_snapshot(DEP)
        return Observed(
            result,
            _runners(await self.state.runners()),
            self.state.pool(),
            self.state.sleepers(DEP),
            (snapshot.depth, snapshot.job_depth),
        )


class Real(World):
    def __init__(self, url: str) -> None:
        self.client = async_client(url)
        self.state = PlatformState(self.client)
        self.requests = RequestQueue(self.client, request_ttl_s=60)
        self.redis = redis.Redis.from_url(url)
        self.sync = sync_client(url)

    def runner(self, runner_id: str) -> RunnerQueue:
        return RunnerQueue(self.sync, runner_id, lease_ttl_s=5.0, result_ttl_s=60)

    async def put(self, record: RunnerRecord) -> None:
        await self.state.put_runner(record)

    async def join_pool(self, runner_id: str) -> None:
        # As a stem done importing does (runners/stem.py).
        self.runner(runner_id).set_fields(state=RunnerState.PREWARMED)
        self.runner(runner_id).offer_as_stem()

    async def set_state(self, runner_id: str, state: RunnerState) -> None:
        self.runner(runner_id).set_fields(state=state)

    async def enqueue(self, i: int) -> bool:
        self.redis.delete(keys.WAKE)
        work = WorkItem(
            request_id=f"req-{i}",
            deployment=DEP,
            prompt_token_ids=[1, 2, 3],
            sampling=SamplingSpec(max_tokens=4),
        )
        await self.requests.enqueue(work, admission_window_s=60, depth_limit=100)
        return self.redis.lrange(keys.WAKE, 0, -1) == [DEP.encode()]

    async def queue_jobs(self, count: int) -> None:
        for i in range(count):  # job attempts, as job_submit.lua queues them
            self.redis.hset(keys.request(f"job-{i}"), mapping={"state": "queued", "work": b"{}"})
            self.redis.zadd(keys.job_queue(DEP), {f"job-{i}": i + 1})

    async def try_sleep(self, runner_id: str) -> bool:
        return self.runner(runner_id).try_sleep(DEP)

    async def try_drain(self, runner_id: str) -> bool:
        return self.runner(runner_id).try_drain(DEP)

    async def serving_runner_count(self) -> int:
        return self.runner("counting").serving_runner_count(DEP)

    async def observe(self, result: object) -> Observed:
        snapshot = await self.state.queue_snapshot(DEP)
        return Observed(
            result,
            _runners(await self.state.runners()),
            frozenset(m.decode() for m in self.redis.smembers(keys.STEMS)),
            frozenset(m.decode() for m in self.redis.smembers(keys.sleepers(DEP))),
            (snapshot.depth, snapshot.job_depth),
        )


def _runners(records: list[RunnerRecord]) -> dict[str, tuple[str, str, str, bool, bool]]:
    # Timestamps differ by clock (simulated, the server's): compared as "was it set".
    return {
        r.runner_id: (
            r.state.value,
            r.deployment,
            r.deployment_uid,
            r.woken_ms > 0,
            r.assigned_ms > 0,
        )
        for r in records
    }


@dataclass(frozen=True)
class Step:
    run: Callable[[Any], Awaitable[object]]
    at_random: bool = False  # the platform takes by SPOP: compare what every order agrees on


def take_stem(candidates: tuple[str, ...] | None = None) -> Step:
    if candidates is None:
        return Step(lambda w: w.state.take_stem(), at_random=True)
    return Step(lambda w: w.state.take_stem(list(candidates)))


def take_sleeper(uid: str) -> Step:
    return Step(lambda w: w.state.take_sleeper(DEP, uid), at_random=True)


def wake_sleeper(runner_id: str) -> Step:
    return Step(lambda w: w.state.wake_sleeper(runner_id, DEP, MINE))


def assign(runner_id: str) -> Step:
    return Step(lambda w: w.state.assign(runner_id, DEP, MINE))


def mark_gone(runner_id: str) -> Step:
    return Step(lambda w: w.state.mark_runner_gone(runner_id, state=RunnerState.FAILED))


def forget(runner_id: str) -> Step:
    return Step(lambda w: w.state.forget_runner(runner_id))


def try_drain(runner_id: str) -> Step:
    return Step(lambda w: w.try_drain(runner_id))


def try_sleep(runner_id: str) -> Step:
    return Step(lambda w: w.try_sleep(runner_id))


def serving_count() -> Step:
    return Step(lambda w: w.serving_runner_count())


def stem(runner_id: str, state: RunnerState = S.PREWARMED) -> tuple[str, RunnerState, str, str]:
    return (runner_id, state, "", "")


def sleeper(
    runner_id: str, uid: str = MINE, state: RunnerState = S.SLEEPING
) -> tuple[str, RunnerState, str, str]:
    return (runner_id, state, DEP, uid)


def serving(
    runner_id: str, state: RunnerState = S.READY, deployment: str = DEP
) -> tuple[str, RunnerState, str, str]:
    return (runner_id, state, deployment, MINE)


def pool(*runners: tuple[str, RunnerState, str, str]) -> Scenario:
    return Scenario(runners=runners, stems=tuple(r[0] for r in runners))


def asleep(*runners: tuple[str, RunnerState, str, str]) -> Scenario:
    return Scenario(runners=runners, sleepers=tuple(r[0] for r in runners))


def one_ready(requests: int = 0, jobs: int = 0) -> Scenario:
    return Scenario(runners=(serving("r"),), requests=requests, jobs=jobs)


# (id, scenario, step): each step's outcome must be the same in both worlds.
CASES: list[tuple[str, Scenario, Step]] = [
    ("take-stem/empty-pool", Scenario(runners=()), take_stem()),
    ("take-stem/live", pool(stem("a")), take_stem()),
    ("take-stem/loading-since", pool(stem("a", S.LOADING)), take_stem()),
    ("take-stem/exited-since", pool(stem("a", S.EXITED)), take_stem()),
    ("take-stem/dead-then-live", pool(stem("a", S.EXITED), stem("b")), take_stem()),
    ("take-stem/all-dead", pool(stem("a", S.EXITED), stem("b", S.DRAINING)), take_stem()),
    ("take-stem/candidates-order", pool(stem("a"), stem("b")), take_stem(("b", "a"))),
    ("take-stem/candidate-dead-first", pool(stem("a", S.EXITED), stem("b")), take_stem(("a", "b"))),
    ("take-stem/dead-left-behind", pool(stem("a", S.EXITED), stem("b")), take_stem(("b", "a"))),
    (
        "take-stem/candidate-not-in-pool",
        Scenario(runners=(stem("a"), stem("b")), stems=("b",)),
        take_stem(("a",)),
    ),
    ("take-stem/no-candidates", pool(stem("a")), take_stem(())),
    ("take-sleeper/none", Scenario(runners=()), take_sleeper(MINE)),
    ("take-sleeper/mine", asleep(sleeper("s")), take_sleeper(MINE)),
    ("take-sleeper/another-uid", asleep(sleeper("s", OTHER)), take_sleeper(MINE)),
    ("take-sleeper/unbound-asked-unbound", asleep(sleeper("s", "")), take_sleeper("")),
    ("take-sleeper/woken-since", asleep(sleeper("s", state=S.READY)), take_sleeper(MINE)),
    ("take-sleeper/exited-since", asleep(sleeper("s", state=S.EXITED)), take_sleeper(MINE)),
    (
        "take-sleeper/none-eligible",
        asleep(sleeper("s", OTHER), sleeper("t", state=S.EXITED)),
        take_sleeper(MINE),
    ),
    (
        "take-sleeper/mine-among-others",
        asleep(sleeper("s", OTHER), sleeper("t"), sleeper("u", state=S.DRAINING)),
        take_sleeper(MINE),
    ),
    ("wake-sleeper", asleep(sleeper("s")), wake_sleeper("s")),
    ("assign-stem", Scenario(runners=(stem("a"),)), assign("a")),
    ("mark-gone/pooled-stem", pool(stem("a"), stem("b")), mark_gone("a")),
    ("forget/pooled-stem", pool(stem("a"), stem("b")), forget("a")),
    ("try-drain/queues-empty", one_ready(), try_drain("r")),
    ("try-drain/requests-queued", one_ready(requests=2), try_drain("r")),
    ("try-drain/jobs-queued", one_ready(jobs=1), try_drain("r")),
    ("try-drain/both-queued", one_ready(requests=1, jobs=2), try_drain("r")),
    ("try-sleep/queues-empty", one_ready(), try_sleep("r")),
    ("try-sleep/requests-queued", one_ready(requests=1), try_sleep("r")),
    ("try-sleep/jobs-queued", one_ready(jobs=1), try_sleep("r")),
    ("try-sleep/beside-a-sleeper", asleep(sleeper("s"), serving("r")), try_sleep("r")),
    (
        "serving-count/every-state",
        Scenario(
            runners=(
                *(serving(f"r-{state.value}", state) for state in RunnerState),
                serving("elsewhere", deployment="dep-b"),
                stem("a"),
            )
        ),
        serving_count(),
    ),
]


@pytest.mark.parametrize(("scenario", "step"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_the_simulators_step_has_the_platforms_outcome(redis_url, scenario, step):
    mirror, real = Mirror(), Real(redis_url)
    await mirror.setup(scenario)
    await real.setup(scenario)
    seen_mirror = await mirror.observe(await step.run(mirror))
    seen_real = await real.observe(await step.run(real))
    if step.at_random:
        eligible = _eligible(scenario)
        seen_mirror, seen_real = seen_mirror.agreed(eligible), seen_real.agreed(eligible)
    assert seen_mirror == seen_real
    await real.client.aclose()


def _eligible(scenario: Scenario) -> frozenset[str]:
    """The runners a take could return: a live stem, a sleeper of uid MINE still asleep."""
    return frozenset(
        runner_id
        for runner_id, state, _, uid in scenario.runners
        if state is S.PREWARMED or (state is S.SLEEPING and uid == MINE)
    )


async def test_every_order_of_the_mirror_agrees_where_redis_picks_at_random(redis_url):
    """SPOP picks at random, the mirror in the order runners joined: with one eligible
    runner among ineligible ones, every order the mirror could see gives what Redis gave."""
    runners = (sleeper("s", OTHER), sleeper("t"), sleeper("u", state=S.EXITED))
    eligible = _eligible(asleep(*runners))
    real = Real(redis_url)
    await real.setup(asleep(*runners))
    expected = (await real.observe(await take_sleeper(MINE).run(real))).agreed(eligible)
    for order in itertools.permutations(runners):
        mirror = Mirror()
        await mirror.setup(asleep(*order))
        assert (await mirror.observe(await take_sleeper(MINE).run(mirror))).agreed(
            eligible
        ) == expected
    await real.client.aclose()


@pytest.mark.parametrize("queued", [0, 1, 3])
async def test_the_mirror_wakes_the_controller_whenever_enqueue_lua_does(redis_url, queued):
    """The simulation wakes the controller on every admission (enqueue.lua less often):
    it may reconcile more often than the platform, never less."""
    mirror, real = Mirror(), Real(redis_url)
    for world in (mirror, real):
        await world.setup(Scenario(runners=(), requests=queued))
    real_woke = await real.enqueue(queued)
    assert real_woke == (queued == 0)
    assert await mirror.enqueue(queued) or not real_woke
    await real.client.aclose()
