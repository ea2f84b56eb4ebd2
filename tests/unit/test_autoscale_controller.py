"""Issue 39's policies through the real `Controller` on the simulator: a schedule's
runners are ready at its start (launched ahead by the expected cold start), and a
policy's scale-in drains a ready runner, which finishes and exits."""

from __future__ import annotations

import datetime as dt

from ebb.coldstart.simulation import ScalingSettings, SimulatedPlatform
from ebb.coldstart.simulation_trace import TraceRequest
from ebb.queue.scaling_spec import ScalingSpec, ScheduleEntry
from ebb.queue.schema import RunnerRecord, RunnerState


def mine(p: SimulatedPlatform) -> list[RunnerRecord]:
    return [r for r in p.state.records.values() if r.deployment == "m"]


async def started(settings: ScalingSettings) -> SimulatedPlatform:
    p = SimulatedPlatform(settings)
    p.deploy(settings.spec("m"))
    await p.start()
    return p


async def test_scheduled_runners_are_ready_at_the_scheduled_time_not_after():
    wall_start = dt.datetime(2026, 12, 7, 8, 58, tzinfo=dt.UTC).timestamp()  # a Monday
    peak = ScheduleEntry(days=("mon",), start="09:00", end="10:00", min_replicas=2)
    settings = ScalingSettings(max_replicas=4, scaling=ScalingSpec(schedule=(peak,)))
    p = SimulatedPlatform(settings, wall_start_s=wall_start)
    p.deploy(settings.spec("m"))
    await p.start()
    # The expected cold start is the slowest tier's (fresh: 10 s): nothing before 08:59:50.
    await p.run_until(105.0)
    assert mine(p) == []
    await p.run_until(120.0)  # 09:00:00
    ready = [r for r in mine(p) if r.state is RunnerState.READY]
    assert len(ready) == 2


async def test_a_policy_scale_in_drains_a_ready_runner_which_exits():
    learned = ScalingSpec(keep_alive="learned")
    p = await started(ScalingSettings(max_replicas=4, idle_timeout_s=600.0, scaling=learned))
    request = TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=25)
    for _ in range(40):  # a steady trickle: idle periods of ~1 s (keep-alive 2 s)
        p.state.enqueue("m", request)
        await p.run_until(p.clock.now_s + 2.05)
    assert [r.state for r in mine(p)] == [RunnerState.READY]
    await p.run_until(p.clock.now_s + 5.0)  # idle past the learned 2 s, not the 600 s
    assert [r.state for r in mine(p)] == [RunnerState.EXITED]
