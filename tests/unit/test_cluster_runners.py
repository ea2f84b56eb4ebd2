"""Runners that belong to the cluster, on the simulation's pieces: one its launcher does not
know (launched by an earlier leader, or on another node) lives while it heartbeats — a
stem of it is handed work, a silent one is dropped — and a standby never acts."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from ebb.coldstart.controller import Controller
from ebb.coldstart.simulation import ScalingSettings, SimulatedPlatform
from ebb.coldstart.simulation_trace import TraceRequest
from ebb.config import Settings
from ebb.queue.schema import RunnerRecord, RunnerState

REQUEST = TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=5)


def foreign_stem(p: SimulatedPlatform, runner_id: str, heartbeat_ago_s: float) -> None:
    """A pre-warmed runner in Redis that this controller's launcher never started."""
    p.state.records[runner_id] = RunnerRecord(
        runner_id=runner_id,
        state=RunnerState.STARTING,
        launched_ms=p.clock.ms(0.0),
        heartbeat_ms=p.clock.ms(p.clock.now_s - heartbeat_ago_s),
    )
    p.state.join_pool(runner_id)


async def test_a_heartbeating_stem_of_another_launcher_is_handed_work():
    p = SimulatedPlatform(replace(ScalingSettings(), prewarm=0))
    p.deploy(ScalingSettings().spec("m"))
    p.clock.advance(60.0)
    foreign_stem(p, "r-foreign", heartbeat_ago_s=1.0)
    p.state.enqueue("m", REQUEST)
    await p.controller.reconcile()
    assert p.state.records["r-foreign"].deployment == "m", "assigned, not declared dead"
    assert not [d for _, d, _ in p.launcher.launches if d == "m"], "no second runner"


async def test_a_silent_one_is_marked_gone_and_replaced():
    p = SimulatedPlatform(replace(ScalingSettings(), prewarm=0))
    p.deploy(ScalingSettings().spec("m"))
    p.clock.advance(60.0)
    foreign_stem(p, "r-silent", heartbeat_ago_s=30.0)
    p.state.enqueue("m", REQUEST)
    await p.controller.reconcile()
    assert p.state.records["r-silent"].state is RunnerState.FAILED
    assert [d for _, d, _ in p.launcher.launches] == ["m"]


class Standby:
    term = 0
    asked = 0

    def leading(self) -> bool:
        self.asked += 1
        return False


async def test_a_standby_controller_launches_nothing_and_leaves_the_wake_list():
    p = SimulatedPlatform(ScalingSettings())
    p.deploy(ScalingSettings().spec("m"))
    leadership = Standby()
    standby = Controller(
        Settings(prewarm=1, metering=False, controller_poll_s=0.01),
        p.state,
        p.launcher,
        clock=p.clock,
        leader=leadership,
    )
    p.state.enqueue("m", REQUEST)
    run = asyncio.create_task(standby.run())
    for _ in range(500):  # until it has stood by for a few ticks
        if leadership.asked >= 3:
            break
        await asyncio.sleep(0.01)
    standby.stop()
    assert leadership.asked >= 3
    await asyncio.wait_for(run, 5)
    assert p.launcher.launches == []
    assert await p.state.wait_for_wake(0.0) == {"m"}, "the leader's wake-up is still there"
