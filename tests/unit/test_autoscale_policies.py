"""Issue 39's scaling policies as data: `plan(world)` for hand-built worlds with a
`scaling` block, and the pure rules under it (schedule, reversal gap, keep-alive)."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import msgspec
import pytest
from support.scaling_worlds import (
    NOW,
    RecordedLatencies,
    drains,
    launches,
    ready,
    reasons,
    spec,
    world,
)

from ebb.coldstart.keepalive import MIN_PERIODS, learn_keep_alive
from ebb.coldstart.plan import Launch, Scaled, plan
from ebb.coldstart.scaling_inputs import Measured
from ebb.coldstart.scaling_tracker import Latency, ScalingTracker
from ebb.coldstart.schedule import minimum_at
from ebb.coldstart.world import Demand, World
from ebb.launching.tiers import Tier
from ebb.queue.scaling_spec import (
    QUEUE_ONLY,
    ScalingSpec,
    ScheduleEntry,
    SloTarget,
    UtilisationRule,
)
from ebb.queue.schema import DeploymentSpec

SLO = ScalingSpec(policy="slo", slo=SloTarget(ttft_p90_s=1.0))


def test_slo_broken_adds_a_runner_before_anything_queues() -> None:
    actions = plan(world(SLO, ready("a"), Measured(ttft_p90_s=1.8, held={"a": 5})))
    assert launches(actions) == 1
    assert "p90 ttft 1.800s > target 1s (0 queued, slots 62% busy)" in reasons(actions)


def test_slo_broken_on_runners_with_free_slots_adds_none_and_says_why() -> None:
    actions = plan(world(SLO, ready("a"), Measured(ttft_p90_s=1.8, held={"a": 1})))
    assert launches(actions) == 0
    assert "not for lack of runners" in reasons(actions)


def test_slo_met_with_room_drains_the_least_useful_runner() -> None:
    measured = Measured(ttft_p90_s=0.2, held={"a": 3, "b": 0, "c": 1})
    actions = plan(world(SLO, ready("a", "b", "c"), measured))
    assert drains(actions) == ["b"]
    assert launches(actions) == 0
    assert "2 runners would still meet the target" in reasons(actions)


def test_slo_met_keeps_every_runner_while_the_recent_peak_needs_them() -> None:
    measured = Measured(ttft_p90_s=0.2, held={"a": 3, "b": 0, "c": 1}, peak_held=12)
    assert plan(world(SLO, ready("a", "b", "c"), measured)) == []


def test_slo_met_narrowly_keeps_every_runner() -> None:
    actions = plan(world(SLO, ready("a", "b"), Measured(ttft_p90_s=0.5)))
    assert actions == []


def test_one_reversal_per_gap_holds_a_scale_out_right_after_a_scale_in() -> None:
    measured = Measured(ttft_p90_s=1.8, held={"a": 8}, last_in_s=NOW - 60)
    actions = plan(world(SLO, ready("a"), measured))
    assert launches(actions) == 0
    assert "held 240s more" in reasons(actions)
    later = Measured(ttft_p90_s=1.8, held={"a": 8}, last_in_s=NOW - 301)
    assert launches(plan(world(SLO, ready("a"), later))) == 1


UTIL = ScalingSpec(policy="utilisation")


def samples(share: float, over_s: float, step_s: float = 10.0) -> tuple[tuple[float, float], ...]:
    n = int(over_s / step_s)
    return tuple((NOW - over_s + i * step_s, share) for i in range(n + 1))


def test_utilisation_above_70_for_5_minutes_adds_one() -> None:
    actions = plan(world(UTIL, ready("a", "b"), Measured(utilisation=samples(0.8, 300))))
    assert launches(actions) == 1
    assert "above 70% for 300s" in reasons(actions)


def test_utilisation_above_70_for_less_than_5_minutes_waits() -> None:
    assert plan(world(UTIL, ready("a", "b"), Measured(utilisation=samples(0.8, 200)))) == []


def test_utilisation_below_25_for_30_minutes_drains_one_not_below_min() -> None:
    quiet = Measured(utilisation=samples(0.1, 1800), held={"a": 1, "b": 0})
    assert drains(plan(world(UTIL, ready("a", "b"), quiet))) == ["b"]
    assert drains(plan(world(UTIL, ready("a", "b"), quiet, min_replicas=2))) == []


def test_utilisation_thresholds_are_the_deployments() -> None:
    rule = ScalingSpec(policy="utilisation", utilisation=UtilisationRule(up_pct=90, up_for_s=60))
    assert plan(world(rule, ready("a"), Measured(utilisation=samples(0.8, 300)))) == []


def _at(text: str, tz: str = "Europe/Paris") -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(tz)).timestamp()


PEAK = ScheduleEntry(
    days=("mon", "tue", "wed", "thu", "fri"),
    start="09:00",
    end="18:00",
    tz="Europe/Paris",
    min_replicas=2,
)
SCHEDULED = ScalingSpec(schedule=(PEAK,))


def test_schedule_starts_runners_ahead_by_the_cold_start() -> None:
    # Monday 08:59:30 Paris, a cold start of 45 s: start now to be ready at 09:00.
    before = _at("2026-12-07T08:59:30")
    actions = plan(world(SCHEDULED, (), Measured(), wall_s=before, cold_start_s=45.0))
    assert launches(actions) == 2
    assert "starting 45s ahead" in reasons(actions)
    # With a 20 s cold start, 08:59:30 is too early.
    assert plan(world(SCHEDULED, (), Measured(), wall_s=before, cold_start_s=20.0)) == []


def test_schedule_respects_days_time_zone_and_midnight() -> None:
    assert minimum_at((PEAK,), _at("2026-12-05T10:00"))[0] == 0  # a Saturday
    assert minimum_at((PEAK,), _at("2026-12-07T10:00"))[0] == 2
    assert minimum_at((PEAK,), _at("2026-12-07T10:00", "UTC"))[0] == 2  # 11:00 Paris
    assert minimum_at((PEAK,), _at("2026-12-07T17:30", "UTC"))[0] == 0  # 18:30 Paris
    night = ScheduleEntry(days=("fri",), start="22:00", end="02:00", min_replicas=1)
    assert minimum_at((night,), _at("2026-12-05T01:00", "UTC"))[0] == 1  # Sat 01:00
    assert minimum_at((night,), _at("2026-12-06T01:00", "UTC"))[0] == 0  # Sun 01:00


def test_schedule_floor_keeps_runners_the_policy_would_drain() -> None:
    quiet = Measured(utilisation=samples(0.1, 1800))
    rule = ScalingSpec(policy="utilisation", schedule=(PEAK,))
    assert drains(plan(world(rule, ready("a", "b"), quiet, wall_s=_at("2026-12-07T10:00")))) == []


def test_keep_alive_is_learned_from_idle_periods_with_a_fallback() -> None:
    few = learn_keep_alive([1.0] * (MIN_PERIODS - 1), 60.0)
    assert (few.window_s, few.learned) == (60.0, False)
    short = learn_keep_alive([1.0] * 98 + [8.0] * 2, 60.0)
    assert short.learned and short.window_s == 8.0
    long = learn_keep_alive([1.0] * 90 + [90.0] * 10, 60.0)
    assert (long.window_s, long.learned) == (60.0, False)


LEARNED = ScalingSpec(keep_alive="learned")
SHORT_GAPS = tuple([3.0] * 40)


def test_learned_keep_alive_goes_to_zero_once_idle_past_the_learned_window() -> None:
    idle = Measured(idle_periods_s=SHORT_GAPS, idle_s=5.0, idle_for_s={"a": 5.0, "b": 5.0})
    actions = plan(world(LEARNED, ready("a", "b"), idle))
    assert sorted(drains(actions)) == ["a", "b"]
    assert "idle 5s > keep-alive 3.0s" in reasons(actions)
    assert drains(plan(world(LEARNED, ready("a", "b"), idle, min_replicas=1))) == ["b"]
    soon = Measured(idle_periods_s=SHORT_GAPS, idle_s=2.0, idle_for_s={"a": 2.0})
    assert plan(world(LEARNED, ready("a"), soon)) == []


def test_learned_keep_alive_falls_back_to_the_fixed_window_without_history() -> None:
    idle = Measured(idle_periods_s=SHORT_GAPS[:5], idle_s=30.0, idle_for_s={"a": 30.0})
    assert plan(world(LEARNED, ready("a"), idle)) == []


def test_a_spare_idle_runner_goes_while_the_rest_hold_the_recent_peak() -> None:
    busy = {"a": 4, "b": 0, "c": 0}
    idle_for = {"b": 12.0, "c": 3.0}
    low = Measured(idle_periods_s=SHORT_GAPS, held=busy, idle_for_s=idle_for, peak_held=8)
    actions = plan(world(LEARNED, ready("a", "b", "c"), low))
    assert drains(actions) == ["b"]  # c has been idle too briefly
    high = Measured(idle_periods_s=SHORT_GAPS, held=busy, idle_for_s=idle_for, peak_held=13)
    assert drains(plan(world(LEARNED, ready("a", "b", "c"), high))) == []


def test_the_queue_only_block_plans_as_before() -> None:
    assert plan(world(QUEUE_ONLY, ready("a"), Measured(ttft_p90_s=9.0))) == []


def test_the_default_block_is_the_queue_rule_with_the_hybrid_keep_alive() -> None:
    assert ScalingSpec() == msgspec.structs.replace(QUEUE_ONLY, keep_alive="hybrid")


def test_scaling_block_round_trips_with_from_and_to() -> None:
    raw = b'{"policy":"slo","slo":{"ttft_p90_s":1},"schedule":[{"from":"09:00","to":"17:00"}]}'
    block = msgspec.json.decode(raw, type=ScalingSpec)
    assert block.schedule[0].start == "09:00"
    assert b'"from":"09:00"' in msgspec.json.encode(block)


@pytest.mark.parametrize("tier", [Tier.FRESH])
def test_scale_out_launches_a_fresh_runner(tier: Tier) -> None:
    actions = plan(world(SLO, ready("a"), Measured(ttft_p90_s=1.8, held={"a": 8})))
    assert [a.tier for a in actions if isinstance(a, Launch)] == [tier]


def test_a_policy_scale_in_waits_out_the_gap_after_any_scale_out() -> None:
    quiet = Measured(ttft_p90_s=0.2, held={"a": 0, "b": 0}, last_out_s=NOW - 100)
    actions = plan(world(SLO, ready("a", "b"), quiet))
    assert drains(actions) == []
    assert "held 200s more" in reasons(actions)


def test_a_queue_scale_out_is_remembered_as_one() -> None:
    queued = Demand(spec=spec(SLO), ready=1, queue_depth=20, oldest_wait_s=3.0)
    actions = plan(World(demands=(queued,), runners=ready("a"), wall_s=NOW))
    [scaled] = [a for a in actions if isinstance(a, Scaled)]
    assert scaled.direction == 1 and "queue: 20 waiting" in scaled.reasons


def test_a_repeated_hold_is_logged_once_a_minute_and_moves_are_remembered() -> None:
    tracker = ScalingTracker(None)
    hold = Scaled("m", "slo", 1, 0, ("p90 ttft 1.800s > target 1s, but slots 10% busy",))
    again = Scaled("m", "slo", 1, 0, ("p90 ttft 1.900s > target 1s, but slots 12% busy",))
    assert tracker.after_plan([hold], NOW) == [hold]
    assert tracker.after_plan([again], NOW + 30) == []
    assert tracker.after_plan([again], NOW + 61) == [again]
    out = Scaled("m", "slo", 2, 1, ("p90 ttft 1.8s > target 1s (3 queued)",))
    assert tracker.after_plan([out], NOW + 70) == [out]


async def test_the_tracker_measures_p90s_of_a_versions_requests_and_forgets_the_gone() -> None:
    source = RecordedLatencies()
    tracker = ScalingTracker(source)
    unit = DeploymentSpec(name="m@v2", source="s3://m", scaling=SLO, max_concurrency=4)
    await tracker.measure(unit, ["a"], NOW)
    source.finished = [Latency("m", NOW + i, ttft_s=0.1 * i, tpot_s=0.01) for i in range(1, 11)]
    source.finished.append(Latency("other", NOW + 5, ttft_s=9.0))
    await tracker.read_latencies(["m@v2"])
    measured, cold_start_s = await tracker.measure(unit, ["a"], NOW + 10)
    assert measured.ttft_p90_s == pytest.approx(0.9) and measured.tpot_p90_s == 0.01
    assert measured.utilisation == ((NOW, 0.5), (NOW + 10, 0.5)) and cold_start_s > 0
    await tracker.read_latencies([])
    fresh, _ = await tracker.measure(unit, ["a"], NOW + 11)
    assert fresh.ttft_p90_s is None, "a deployment gone and back starts measuring afresh"


class CountedLatencies(RecordedLatencies):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def latencies_after(self, cursor: bytes) -> tuple[bytes, list[Latency]]:
        self.reads += 1
        return await super().latencies_after(cursor)


async def test_only_a_latency_target_reads_finished_requests() -> None:
    # Every deployment is measured (the default block is the hybrid keep-alive), but
    # finished requests are read, and kept, only for one with a latency target.
    source = CountedLatencies()
    tracker = ScalingTracker(source)
    plain = DeploymentSpec(name="m", source="s3://m", max_concurrency=4)
    await tracker.measure(plain, ["a"], NOW)
    source.finished = [Latency("m", NOW + i, ttft_s=0.1 * i) for i in range(1, 11)]
    await tracker.read_latencies(["m"])
    assert source.reads == 0
    measured, _ = await tracker.measure(plain, ["a"], NOW + 10)
    assert measured.ttft_p90_s is None
    targeted = msgspec.structs.replace(plain, scaling=SLO)
    await tracker.measure(targeted, ["a"], NOW + 10)
    await tracker.read_latencies(["m"])
    assert source.reads == 1
    measured, _ = await tracker.measure(targeted, ["a"], NOW + 11)
    assert measured.ttft_p90_s == pytest.approx(0.9)
