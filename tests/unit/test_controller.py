"""The real `Controller` on the simulation's pieces: a simulated launcher, an in-memory
state and a manual clock. Tier choice, pool refill, backoff after failed starts and
min_replicas, each in simulated seconds (nothing sleeps, no process starts)."""

from __future__ import annotations

from dataclasses import replace

from ebb.coldstart.controller import MAX_START_FAILURES
from ebb.coldstart.simulation import ScalingSettings, SimulatedPlatform
from ebb.coldstart.simulation_trace import TraceRequest
from ebb.launching.tiers import Tier, WarmState
from ebb.queue.schema import RunnerRecord, RunnerState

REQUEST = TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=25)  # 1.05 s
SETTINGS = ScalingSettings(max_replicas=4, idle_timeout_s=5.0)


async def platform(
    settings: ScalingSettings = SETTINGS, failing: frozenset[str] = frozenset()
) -> SimulatedPlatform:
    p = SimulatedPlatform(settings, failing=failing)
    p.deploy(settings.spec("m"))
    await p.start()
    return p


def runners(p: SimulatedPlatform, deployment: str = "m") -> list[RunnerRecord]:
    return [r for r in p.state.records.values() if r.deployment == deployment]


def stems(p: SimulatedPlatform) -> list[RunnerRecord]:
    return [
        r
        for r in p.state.records.values()
        if r.deployment == "" and r.state is RunnerState.PREWARMED
    ]


async def test_a_stem_answers_the_first_request_and_the_pool_refills_once_it_is_up():
    p = await platform()
    [stem] = stems(p)
    p.state.enqueue("m", REQUEST)
    await p.control()
    [runner] = runners(p)
    assert (runner.runner_id, runner.tier) == (stem.runner_id, Tier.PREWARMED)
    assert not [d for _, d, _ in p.launcher.launches if d == "m"], "no launch: the stem went"
    # No refill while the stem loads for real work (its cores are busy).
    await p.run_until(1.5)
    assert not stems(p) and runners(p)[0].state is RunnerState.LOADING
    await p.run_until(3.0)
    assert runners(p)[0].state is RunnerState.READY
    [new_stem] = stems(p)
    assert new_stem.runner_id != stem.runner_id


async def test_without_a_stem_a_start_is_forked_while_the_fork_server_is_up_else_fresh():
    forked = await platform(replace(SETTINGS, prewarm=0))
    spawned = await platform(replace(SETTINGS, prewarm=0, fork_server=False))
    for p in (forked, spawned):
        p.state.enqueue("m", REQUEST)
        await p.control()
    assert [r.tier for r in runners(forked)] == [Tier.FORKED]
    assert [r.tier for r in runners(spawned)] == [Tier.FRESH]
    assert (forked.state.fork_server, spawned.state.fork_server) == ("ready", "off")


async def test_a_sleeping_runner_is_woken_before_any_stem_or_launch():
    p = await platform()
    await p.state.put_runner(
        RunnerRecord(runner_id="r-sleeper", state=RunnerState.READY, deployment="m", ready_ms=1)
    )
    assert p.state.try_sleep("m", "r-sleeper")
    launched = len(p.launcher.launches)
    p.state.enqueue("m", REQUEST)
    await p.control()
    sleeper = p.state.records["r-sleeper"]
    assert sleeper.woken_ms > sleeper.ready_ms and sleeper.is_starting
    assert len(p.launcher.launches) == launched and len(stems(p)) == 1


async def test_the_pool_is_not_refilled_while_the_fork_server_starts():
    p = SimulatedPlatform(SETTINGS)
    p.launcher.warm = WarmState.STARTING
    await p.control()
    assert not p.launcher.launches and p.state.fork_server == "starting"
    p.launcher.warm = WarmState.READY
    await p.run_until(1.0)
    assert [(d, t) for _, d, t in p.launcher.launches] == [(None, Tier.PREWARMED)]


async def test_a_dead_stem_is_never_handed_work_and_is_replaced():
    p = await platform()
    [stem] = stems(p)
    p.launcher.kill(stem.runner_id)
    p.state.enqueue("m", REQUEST)  # demand right after the death
    await p.control()
    dead = p.state.records[stem.runner_id]
    assert dead.state is RunnerState.FAILED and dead.deployment == ""
    [runner] = runners(p)
    assert runner.runner_id != stem.runner_id and runner.tier == Tier.FORKED
    await p.run_until(3.0)
    [replacement] = stems(p)
    assert replacement.runner_id != stem.runner_id


async def test_a_stem_that_died_unreported_is_skipped_by_the_alive_check():
    p = await platform()
    [stem] = stems(p)
    p.launcher.procs[stem.runner_id].exited = True  # gone, its exit not collected yet
    p.state.enqueue("m", REQUEST)
    await p.controller.reconcile()
    assert p.state.records[stem.runner_id].error == "stem died while pre-warmed"
    assert [r.tier for r in runners(p)] == [Tier.FORKED]


async def test_failed_starts_back_off_then_show_an_error_and_a_success_clears_it():
    p = await platform(replace(SETTINGS, prewarm=0), failing=frozenset({"m"}))
    p.state.enqueue("m", REQUEST)  # never claimed: demand throughout
    launch_times: list[float] = []
    while len(launch_times) < MAX_START_FAILURES + 1:
        seen = len(p.launcher.launches)
        await p.run_until(p.clock.now_s + 0.05)
        if len(p.launcher.launches) > seen:
            launch_times.append(p.clock.now_s)
    gaps = [round(b - a) for a, b in zip(launch_times, launch_times[1:], strict=False)]
    # Each start fails 2 s in (the forked start time); then 2 s, 4 s, 8 s of backoff.
    assert gaps == [2 + 2, 2 + 4, 2 + 8]
    status = p.state.status["m"]
    assert status["error"].startswith(f"{MAX_START_FAILURES} runner starts failed in a row")
    assert "failed to load" in status["error"] and "failed to load" in status["error_log"]
    assert [r.state for r in runners(p)].count(RunnerState.FAILED) == MAX_START_FAILURES

    # The fourth start, launched just now, fails too; the one after 16 s of backoff loads.
    p.launcher.failing = frozenset()
    await p.run_until(p.clock.now_s + 2 + 16 + 2 + 0.5)
    assert any(r.state is RunnerState.READY for r in runners(p))
    assert p.state.status["m"] == {"error": "", "error_log": ""}


async def test_min_replicas_start_without_demand_and_never_drain():
    settings = replace(SETTINGS, min_replicas=2, idle_timeout_s=1.0)
    p = await platform(settings)
    assert sum(r.state is RunnerState.READY for r in runners(p)) == 2
    await p.run_until(30.0)
    live = [r for r in runners(p) if r.state.is_live]
    assert len(live) == 2 and all(r.state is RunnerState.READY for r in live)


async def test_above_min_an_idle_runner_drains_after_its_timeout_unless_work_waits():
    p = await platform(replace(SETTINGS, idle_timeout_s=2.0))
    p.state.enqueue("m", REQUEST)
    await p.run_until(2.5)  # the stem loads (2 s) and takes the request
    [runner] = runners(p)
    assert runner.state is RunnerState.READY
    p.state.job_depth["m"] = 1  # a job waits: try_drain's guard keeps the runner
    await p.run_until(10.0)
    assert p.state.records[runner.runner_id].state is RunnerState.READY
    p.state.job_depth["m"] = 0
    await p.run_until(10.5)
    assert p.state.records[runner.runner_id].state is RunnerState.EXITED
    assert p.launcher.poll() == [] and not p.launcher.alive(runner.runner_id)


async def test_a_killed_runner_is_marked_failed():
    p = await platform()
    p.state.enqueue("m", REQUEST)
    await p.run_until(3.0)
    [runner] = runners(p)
    p.launcher.kill(runner.runner_id)
    await p.run_until(3.5)
    gone = p.state.records[runner.runner_id]
    assert gone.state is RunnerState.FAILED
    assert gone.error == "process exited with code -9"
