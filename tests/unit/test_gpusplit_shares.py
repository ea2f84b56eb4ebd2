"""Serving time thrown away becomes wasted: each request's share of the engine's steps,
and the runner's clock moving it from serving to wasted, never below zero."""

from __future__ import annotations

from ebb.billing.gpu_split import PhaseClock
from ebb.runners.gpu_shares import GpuShares


def test_a_replays_prefill_and_a_failed_requests_share_are_wasted() -> None:
    wasted: list[float] = []
    shares = GpuShares()
    shares.on_waste = wasted.append
    shares.replaying("cont")
    shares.stepped(0.030, ["cont", "fresh", "doomed"])  # 10 ms each
    shares.produced("fresh")
    assert wasted == []
    shares.produced("cont")  # its replay's prefill is over: those 10 ms redid old work
    shares.stepped(0.020, ["cont", "fresh", "doomed"])
    shares.produced("cont")  # new output: nothing more is waste
    shares.ended("fresh", thrown_away=False)
    shares.ended("doomed", thrown_away=True)
    assert [round(ms, 6) for ms in wasted] == [10.0, round(10 + 20 / 3, 6)]


def test_a_job_given_back_without_its_output_wastes_its_share() -> None:
    wasted: list[float] = []
    shares = GpuShares()
    shares.on_waste = wasted.append
    shares.stepped(0.008, ["job"])
    shares.ended("job", thrown_away=True)
    shares.ended("job", thrown_away=True)  # once
    assert [round(ms, 6) for ms in wasted] == [8.0]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_waste_moves_serving_time_never_more_than_was_served() -> None:
    t = FakeClock()
    clock = PhaseClock(t)
    clock.enter("serving")
    t.now = 1.0
    clock.waste(1500)
    assert clock.take() == {"wasted": 1000}  # all it served; 500 ms wait for more serving
    t.now = 2.0
    assert clock.take() == {"serving": 500, "wasted": 500}
    t.now = 3.0
    assert clock.take() == {"serving": 1000}
