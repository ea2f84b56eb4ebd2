"""Issue 39's hybrid histogram keep-alive and pre-warm (per level of need) and the trend
predictor: the pure rules, and `plan(world)` on hand-built worlds with them on."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError
from support.scaling_worlds import NOW, drains, ready, reasons, spec
from support.scaling_worlds import world as world_of

from ebb.coldstart.histogram import (
    CV_MIN,
    MIN_PERIODS,
    bin_cv,
    hybrid_windows,
    level_wanted,
)
from ebb.coldstart.plan import Launch, plan
from ebb.coldstart.scaling import may_start_unqueued
from ebb.coldstart.scaling_inputs import Measured
from ebb.coldstart.scaling_plan import expected_start_s
from ebb.coldstart.scaling_tracker import RunnerLoad, ScalingTracker
from ebb.coldstart.simulation import ScalingSettings, SimulatedPlatform
from ebb.coldstart.simulation_trace import TraceRequest
from ebb.coldstart.trend import holt, trend_extra
from ebb.coldstart.world import Demand, World
from ebb.frontdoor.routes_scaling import ScalingBody
from ebb.launching.tiers import WarmState
from ebb.queue.scaling_spec import QUEUE_ONLY, ScalingSpec
from ebb.queue.schema import RunnerRecord, RunnerState

HYBRID = ScalingSpec(keep_alive="hybrid")
# Gaps that all end within 4 s: keep-alive 4.4 s, nothing far enough to pre-warm.
SHORT = tuple([3.0] * 30 + [4.0] * 10)
# Gaps of 40-45 s: release at once, pre-warm ahead of 36 s, keep until 49.5 s.
FAR = tuple([40.0] * 30 + [45.0] * 10)


def levels(periods: tuple[float, ...], idle_s: tuple[float, ...], **kw: object) -> Measured:
    return Measured(
        level_periods_s=tuple(periods for _ in idle_s),
        level_idle_s=idle_s,
        **kw,  # type: ignore[arg-type]
    )


def world(
    scaling: ScalingSpec, runners: tuple[RunnerRecord, ...], measured: Measured, **kw: object
) -> World:
    """A 2 s cold start and a 60 s idle window unless `kw` says otherwise."""
    return world_of(scaling, runners, measured, cold_start_s=2.0, **({"idle_timeout_s": 60.0} | kw))


# --- the histogram -----------------------------------------------------------------------


def test_windows_are_the_p99_and_the_p5_with_their_margins() -> None:
    short = hybrid_windows(SHORT, 60.0, 2.0)
    assert short.learned and short.keep_s == pytest.approx(4.4) and short.prewarm_s == 0.0
    far = hybrid_windows(FAR, 60.0, 2.0)
    assert far.learned and far.prewarm_s == pytest.approx(36.0)
    assert far.keep_s == pytest.approx(49.5)


def test_gaps_shorter_than_a_cold_start_are_not_in_the_histogram() -> None:
    # Need flickering below a level between two reconciles is not idle time a runner
    # could be given back in (it would not be up again in time): 300 such flickers and
    # 2 real gaps are too few real gaps to learn from, not a 2 s keep-alive.
    flickers = tuple([0.5] * 300 + [20.0] * 2)
    windows = hybrid_windows(flickers, 60.0, 2.0)
    assert (windows.learned, windows.keep_s) == (False, 60.0)
    assert "2 idle periods past the 2s cold start" in windows.why
    real = hybrid_windows(flickers + tuple([20.0] * 40), 60.0, 2.0)
    assert real.learned and real.keep_s == pytest.approx(22.0)


def test_the_keep_alive_never_exceeds_the_fixed_window() -> None:
    assert hybrid_windows(FAR, 30.0, 2.0).keep_s == 30.0


def test_too_few_periods_fall_back_to_the_fixed_window() -> None:
    few = hybrid_windows(SHORT[: MIN_PERIODS - 1], 60.0, 2.0)
    assert (few.learned, few.keep_s) == (False, 60.0)
    # The fixed window, on the level's idle time.
    assert (level_wanted(59.0, few, 2.0), level_wanted(60.0, few, 2.0)) == (True, False)


def test_a_flat_histogram_fails_the_cv_test_and_falls_back() -> None:
    flat = tuple(float(i) for i in range(240))  # one gap per bin: CV 0
    assert bin_cv(flat) == 0.0 < CV_MIN
    windows = hybrid_windows(flat, 60.0, 2.0)
    assert not windows.learned and "CV" in windows.why
    assert bin_cv(SHORT) >= CV_MIN


def test_mostly_out_of_bounds_idle_times_fall_back() -> None:
    windows = hybrid_windows(tuple([1000.0] * 30 + [1.0] * 10), 60.0, 2.0)
    assert not windows.learned and "past 240s" in windows.why


def test_pre_warm_only_when_the_head_is_far_beyond_a_cold_start() -> None:
    # p5 of 9 s, less 10 %: 8.1 s - a 4 s cold start is not worth a release.
    assert hybrid_windows(tuple([9.0] * 40), 60.0, 4.0).prewarm_s == 0.0
    assert hybrid_windows(tuple([9.0] * 40), 60.0, 1.0).prewarm_s == pytest.approx(8.1)


def test_a_pre_warmed_level_is_up_from_a_cold_start_before_its_head_to_its_tail() -> None:
    far = hybrid_windows(FAR, 60.0, 2.0)
    assert level_wanted(0.5, far, 2.0) is False  # released at once
    assert level_wanted(33.9, far, 2.0) is False
    assert level_wanted(34.0, far, 2.0) is True  # 36 s - the 2 s cold start: ready at 36
    assert level_wanted(49.0, far, 2.0) is True
    assert level_wanted(50.0, far, 2.0) is False  # past the keep-alive


# --- the plan with hybrid keep-alive -------------------------------------------------------


def test_a_level_idle_past_its_keep_alive_gives_its_runner_back() -> None:
    # Level 1 needed (a holds work); level 2 idle 10 s past its 4.4 s keep-alive.
    measured = levels(SHORT, (0.0, 10.0, 10.0, 10.0), held={"a": 3, "b": 0})
    actions = plan(world(HYBRID, ready("a", "b"), measured))
    assert drains(actions) == ["b"]
    assert "level 2 idle 10s > keep-alive 4.4s" in reasons(actions)
    within = levels(SHORT, (0.0, 3.0, 3.0, 3.0), held={"a": 3, "b": 0})
    assert plan(world(HYBRID, ready("a", "b"), within)) == []


def test_scale_to_zero_still_works_and_respects_min_replicas() -> None:
    idle = levels(SHORT, (10.0, 10.0, 10.0, 10.0), held={"a": 0, "b": 0})
    assert sorted(drains(plan(world(HYBRID, ready("a", "b"), idle)))) == ["a", "b"]
    assert len(drains(plan(world(HYBRID, ready("a", "b"), idle, min_replicas=1)))) == 1
    # Nothing there and nothing due: nothing starts.
    assert plan(world(HYBRID, (), idle)) == []


def test_a_far_head_releases_at_once_then_pre_warms_before_it() -> None:
    just_idle = levels(FAR, (1.0, 1.0, 1.0, 1.0), held={"a": 0})
    actions = plan(world(HYBRID, ready("a"), just_idle))
    assert drains(actions) == ["a"] and "pre-warm point" in reasons(actions)
    due = levels(FAR, (35.0, 35.0, 35.0, 35.0))
    actions = plan(world(HYBRID, (), due))
    assert [type(a) for a in actions if isinstance(a, Launch)] == [Launch]
    assert "pre-warm: level 1 idle 35s" in reasons(actions)
    early = levels(FAR, (20.0, 20.0, 20.0, 20.0))
    assert plan(world(HYBRID, (), early)) == []


def test_fallback_levels_keep_the_fixed_window_on_the_levels_own_idle_time() -> None:
    # Too little history: the fixed 60 s window, measured on the level's idle time (the
    # gap since concurrency last needed a 2nd runner), not on runner b's: b may have
    # held a request a moment ago only because requests spread over the runners.
    within = levels(SHORT[:5], (0.0, 50.0, 50.0, 50.0), held={"a": 3, "b": 0})
    assert plan(world(HYBRID, ready("a", "b"), within)) == []
    past = levels(SHORT[:5], (0.0, 61.0, 61.0, 61.0), held={"a": 3, "b": 0})
    actions = plan(world(HYBRID, ready("a", "b"), past))
    assert drains(actions) == ["b"]
    assert "level 2 idle 61s > keep-alive 60.0s (5 idle periods" in reasons(actions)


# --- the trend predictor --------------------------------------------------------------------


def rising(step: float, n: int = 10) -> tuple[tuple[float, float], ...]:
    return tuple((NOW + i, 4.0 + step * i) for i in range(n))


def test_holt_follows_a_linear_rise() -> None:
    forecast = holt(rising(1.0), 5.0)
    assert forecast is not None
    assert forecast.slope_per_s == pytest.approx(1.0, rel=0.05)
    assert forecast.demand == pytest.approx(13.0 + 5.0, rel=0.05)
    assert holt(rising(1.0, 3), 5.0) is None  # too few samples


def test_a_rising_demand_on_full_runners_pre_warms_one_more() -> None:
    # 13 held on 2 runners of 8 slots, +1/s: 23 expected in 10 s needs 3.
    extra, why = trend_extra(
        rising(1.0), serving=2, max_replicas=4, max_concurrency=8, cold_start_s=10.0
    )
    assert extra == 1 and "trend: demand rising" in why
    flat = trend_extra(rising(0.0), serving=2, max_replicas=4, max_concurrency=8, cold_start_s=10.0)
    assert flat == (0, "")
    spare = trend_extra(
        rising(1.0), serving=3, max_replicas=4, max_concurrency=8, cold_start_s=10.0
    )
    assert spare[0] == 0  # 13 now fills 2 of 3: the rise is absorbed
    at_max = trend_extra(
        rising(1.0), serving=2, max_replicas=2, max_concurrency=8, cold_start_s=10.0
    )
    assert at_max[0] == 0


def test_the_trend_is_off_by_default_and_logged_when_on() -> None:
    measured = Measured(demand=rising(2.0), held={"a": 8, "b": 8})
    assert plan(world(ScalingSpec(), ready("a", "b"), measured)) == []
    actions = plan(world(ScalingSpec(trend=True), ready("a", "b"), measured))
    assert len([a for a in actions if isinstance(a, Launch)]) == 1
    assert "trend: demand rising" in reasons(actions)


# --- the tracker's levels -------------------------------------------------------------------


class Loads:
    def __init__(self) -> None:
        self.held: dict[str, int] = {}

    async def runner_load(self, runner_ids: list[str]) -> dict[str, RunnerLoad]:
        return {r: RunnerLoad(self.held.get(r, 0)) for r in runner_ids}

    async def latencies_after(self, cursor: bytes) -> tuple[bytes, list[object]]:
        return cursor, []

    async def cold_start_ms(self, deployment: str) -> dict[str, dict[str, float]]:
        return {}


async def test_the_tracker_measures_each_levels_idle_periods() -> None:
    loads = Loads()
    tracker = ScalingTracker(loads)  # type: ignore[arg-type]
    deployment = spec(HYBRID)
    for t, held in [(0.0, 12), (5.0, 3), (8.0, 0), (20.0, 9), (21.0, 20)]:
        loads.held = {"a": held}
        measured, _ = await tracker.measure(deployment, ["a"], NOW + t)
    # need 2, 1, 0, 2, 3: level 1 idle 8-20 s, level 2 idle 5-20 s, level 3 idle 0-21 s.
    assert measured.level_periods_s[:3] == ((12.0,), (15.0,), (21.0,))
    assert measured.level_idle_s == (0.0, 0.0, 0.0, 21.0)


# --- through the real controller on the simulator ------------------------------------------


def live(p: SimulatedPlatform) -> list[RunnerRecord]:
    return [r for r in p.state.records.values() if r.deployment == "m" and r.state.is_live]


async def test_a_regular_deployment_is_released_pre_warmed_in_time_and_goes_to_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ebb.coldstart.decision_log")
    settings = ScalingSettings(max_replicas=2, idle_timeout_s=600.0, scaling=HYBRID)
    p = SimulatedPlatform(settings)
    p.deploy(settings.spec("m"))
    await p.start()
    request = TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=25)  # 1.05 s
    for _ in range(MIN_PERIODS + 2):  # every 40 s: gaps of ~39 s, far beyond a 2 s start
        p.state.enqueue("m", request)
        await p.run_until(p.clock.now_s + 40.0)
        # Pre-warmed at the head of the gaps: a runner is ready when the next one comes.
        assert [r.state for r in live(p)] == [RunnerState.READY]
    p.state.enqueue("m", request)
    await p.run_until(p.clock.now_s + 5.0)
    assert live(p) == []  # the head is far: released at once (not after 600 s)
    await p.run_until(p.clock.now_s + 32.0)
    assert [r.state for r in live(p)] == [RunnerState.READY]  # pre-warmed, none came
    await p.run_until(p.clock.now_s + 20.0)
    assert live(p) == []  # past the keep-alive: zero runners with min_replicas 0
    assert "pre-warm: level 1 idle" in caplog.text
    assert "given back until its pre-warm point" in caplog.text


def test_the_api_accepts_hybrid_and_trend_and_names_a_bad_keep_alive() -> None:
    body = ScalingBody.model_validate({"keep_alive": "hybrid", "trend": True})
    assert body.spec() == ScalingSpec(keep_alive="hybrid", trend=True)
    with pytest.raises(ValidationError, match="keep_alive"):
        ScalingBody.model_validate({"keep_alive": "sometimes"})


def test_the_lead_is_the_next_starts_measured_tier_else_the_slowest() -> None:
    stem = RunnerRecord(runner_id="s", state=RunnerState.PREWARMED)
    measured = Measured(cold_starts_s={"prewarmed": 2.0, "forked": 3.0, "fresh": 10.0})
    demand = Demand(spec=spec(HYBRID), measured=measured, cold_start_s=10.0)
    with_stem = World(demands=(demand,), runners=(stem,), warm=WarmState.READY)
    assert expected_start_s(with_stem, demand) == 2.0
    assert expected_start_s(World(demands=(demand,), warm=WarmState.READY), demand) == 3.0
    assert expected_start_s(World(demands=(demand,)), demand) == 10.0
    unmeasured = Demand(spec=spec(HYBRID), cold_start_s=15.0)
    assert expected_start_s(World(demands=(unmeasured,)), unmeasured) == 15.0


def test_only_a_hybrid_level_with_history_may_start_a_runner_with_nothing_queued() -> None:
    # The controller lists nodes and reads GPU needs only for deployments that may start.
    assert not may_start_unqueued(QUEUE_ONLY, levels(SHORT, (10.0,)))
    assert not may_start_unqueued(HYBRID, Measured())
    assert not may_start_unqueued(HYBRID, levels(SHORT[:29], (10.0,)))
    assert may_start_unqueued(HYBRID, levels(SHORT, (10.0,)))
    assert may_start_unqueued(ScalingSpec(keep_alive="fixed", trend=True), Measured())
    assert may_start_unqueued(ScalingSpec(keep_alive="fixed", policy="utilisation"), Measured())
