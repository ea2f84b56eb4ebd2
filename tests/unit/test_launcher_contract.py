"""The Launcher contract on the simulation's launcher (the fake every controller test runs
on): exits reported exactly once, never alive after; the other launchers run the same
checks in tests/integration (local processes, Kubernetes pods on kmock)."""

from __future__ import annotations

from launcher_contract import check_launch_exit_once

from ebb.coldstart.clock import ManualClock
from ebb.coldstart.simulation_runners import RunnerModel, SimulatedLauncher
from ebb.coldstart.simulation_state import InMemoryState
from ebb.launching.tiers import Tier
from ebb.queue.schema import RunnerRecord, RunnerState


def test_the_simulated_launcher_keeps_the_contract():
    clock = ManualClock()
    state = InMemoryState(clock)
    launcher = SimulatedLauncher(clock, state, RunnerModel())
    state.records["r-contract1"] = RunnerRecord(runner_id="r-contract1", state=RunnerState.STARTING)
    check_launch_exit_once(
        launcher, start=lambda _: None, end=lambda runner_id, code: launcher.exit(runner_id, code)
    )


def test_stop_all_reports_every_runner_once():
    clock = ManualClock()
    launcher = SimulatedLauncher(clock, InMemoryState(clock), RunnerModel())
    for i in range(3):
        launcher.launch(f"r-{i}", "m", Tier.FRESH)
    launcher.stop_all(grace_s=1.0)
    assert sorted(e.runner_id for e in launcher.poll()) == ["r-0", "r-1", "r-2"]
    assert launcher.poll() == [] and not any(launcher.alive(f"r-{i}") for i in range(3))
