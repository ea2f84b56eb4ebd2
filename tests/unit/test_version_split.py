"""Traffic splitting, unit names and rollout transitions (pure logic)."""

from __future__ import annotations

import pytest

from ebb.queue.rollout import (
    RolloutRefused,
    Verdict,
    VersionHealth,
    canary_steps,
    health_of,
    judge,
    promote,
    rollback,
    start,
    warmed,
)
from ebb.queue.scaling_spec import ScalingSpec, ScheduleEntry, SloTarget
from ebb.queue.schema import DeploymentSpec, EngineSpec, UsageRecord
from ebb.queue.versions import (
    RETIRED_IDLE_S,
    RETIRED_SCALING,
    Rollout,
    TrafficSplit,
    VersionRecord,
    compose,
    pick_version,
    route_point,
    split_unit,
    unit_name,
)


def test_unit_names_round_trip_and_version_one_is_the_bare_name():
    assert unit_name("chat", 1) == "chat"
    assert unit_name("chat", 7) == "chat@v7"
    assert split_unit("chat@v7") == ("chat", 7)
    assert split_unit("chat") == ("chat", 1)
    assert split_unit("a.b-c_d@v12") == ("a.b-c_d", 12)


def test_route_point_is_stable_per_key_and_in_range():
    assert route_point("user-42") == route_point("user-42")
    points = {route_point(f"user-{i}") for i in range(2000)}
    assert all(0 <= p < 10_000 for p in points)
    assert len(points) > 1500  # spread, not clustered


def test_split_shares_within_tolerance_for_hashed_keys():
    weights = {1: 90, 2: 10}
    picks = [pick_version(weights, route_point(f"k{i}")) for i in range(20_000)]
    share = picks.count(2) / len(picks)
    assert 0.09 < share < 0.11


def test_growing_share_only_moves_keys_to_the_new_version():
    keys = [f"session-{i}" for i in range(5000)]
    at_10 = {k: pick_version({1: 90, 2: 10}, route_point(k)) for k in keys}
    at_50 = {k: pick_version({1: 50, 2: 50}, route_point(k)) for k in keys}
    assert all(at_50[k] == 2 for k in keys if at_10[k] == 2)
    assert sum(v == 2 for v in at_50.values()) > sum(v == 2 for v in at_10.values())


def test_pick_version_edges():
    assert pick_version({1: 100}, 9999) == 1
    assert pick_version({1: 0, 2: 100}, 0) == 2
    assert pick_version({1: 100, 2: 0}, 9999) == 1
    assert pick_version({3: 0}, 5) == 3  # nothing has traffic: the newest listed


def _spec(**fields) -> DeploymentSpec:
    return DeploymentSpec(**{"name": "chat", "source": "fake://a", "min_replicas": 2, **fields})


def test_compose_takes_version_fields_from_the_version_and_scale_from_the_deployment():
    v2 = VersionRecord(
        version=2,
        created_at_s=1.0,
        spec=DeploymentSpec(name="chat", source="fake://b", engine=EngineSpec(dtype="float32")),
    )
    split = TrafficSplit(weights={1: 50, 2: 50})
    unit = compose(_spec(idle_timeout_s=30), v2, split, 2)
    assert unit.name == "chat@v2" and unit.source == "fake://b"
    assert unit.engine.dtype == "float32"
    assert unit.min_replicas == 2 and unit.idle_timeout_s == 30


def test_compose_a_version_without_traffic_holds_nothing():
    split = TrafficSplit(weights={1: 0, 2: 100})
    unit = compose(_spec(idle_timeout_s=300), None, split, 1)
    assert unit.name == "chat" and unit.min_replicas == 0
    assert unit.idle_timeout_s == RETIRED_IDLE_S


def test_compose_a_version_without_traffic_drops_the_deployments_scaling_block():
    # A schedule's minimum, a trend or a hybrid pre-warm would start runners for a
    # version that no request can reach; it only finishes what it holds, then drains.
    scaling = ScalingSpec(
        policy="slo",
        slo=SloTarget(ttft_p90_s=1.0),
        keep_alive="hybrid",
        trend=True,
        schedule=(ScheduleEntry(min_replicas=3),),
    )
    split = TrafficSplit(weights={1: 0, 2: 100})
    unit = compose(_spec(scaling=scaling), None, split, 1)
    assert unit.scaling == RETIRED_SCALING
    assert unit.scaling.keep_alive == "fixed" and not unit.scaling.trend
    assert unit.scaling.schedule == () and unit.scaling.policy == "queue"
    serving = compose(_spec(scaling=scaling), None, TrafficSplit(weights={1: 100}), 1)
    assert serving.scaling == scaling


def test_compose_a_warming_version_keeps_one_runner():
    rollout = Rollout(from_version=1, to_version=2, strategy="immediate", steps=[100])
    split = start(TrafficSplit(), rollout)
    v2 = VersionRecord(version=2, created_at_s=1.0, spec=_spec(min_replicas=0))
    assert compose(_spec(min_replicas=0), v2, split, 2).min_replicas == 1


def _canary(**fields) -> Rollout:
    return Rollout(
        from_version=1, to_version=2, strategy="canary", steps=canary_steps(10, None), **fields
    )


def test_canary_steps():
    assert canary_steps(10, None) == [10, 50, 100]
    assert canary_steps(60, None) == [60, 100]
    assert canary_steps(None, [50, 5]) == [5, 50, 100]
    assert canary_steps(None, None) == [100]


def test_canary_moves_no_traffic_until_warm_then_steps_to_done():
    split = start(TrafficSplit(), _canary())
    assert split.weights == {1: 100, 2: 0}
    with pytest.raises(RolloutRefused, match="no ready runner"):
        promote(split, 1.0)
    split = warmed(split, 1.0)
    assert split.weights == {1: 90, 2: 10}
    split = promote(split, 2.0)
    assert split.weights == {1: 50, 2: 50}
    split = promote(split, 3.0)
    assert split.weights == {1: 0, 2: 100} and split.rollout.state == "done"
    with pytest.raises(RolloutRefused):
        promote(split, 4.0)


def test_a_second_rollout_waits_for_the_first_and_rollback_restores_the_old_version():
    split = warmed(start(TrafficSplit(), _canary()), 1.0)
    with pytest.raises(RolloutRefused, match="being rolled out"):
        start(split, Rollout(from_version=1, to_version=3, strategy="immediate", steps=[100]))
    back = rollback(split, "by hand", 2.0)
    assert back.weights == {1: 100, 2: 0} and back.rollout.state == "rolled_back"
    with pytest.raises(RolloutRefused):
        rollback(back, "again", 3.0)


def test_start_drops_versions_that_already_drained():
    split = TrafficSplit(weights={1: 0, 2: 100})
    split = start(split, Rollout(from_version=2, to_version=3, strategy="immediate", steps=[100]))
    assert split.weights == {2: 100, 3: 0}


def _usage(version: int, state: str, ttft_ms: float | None) -> UsageRecord:
    return UsageRecord(
        request_id="r",
        deployment="chat",
        tenant="t",
        prompt_tokens=1,
        completion_tokens=1,
        state=state,
        runner_id="x",
        finished_at_s=0,
        version=version,
        ttft_ms=ttft_ms,
    )


def test_health_counts_failures_and_p99_per_version():
    records = [_usage(1, "finished", float(i)) for i in range(100)]
    records += [_usage(2, "failed", None)] * 3 + [_usage(2, "finished", 5.0)] * 7
    records += [_usage(2, "cancelled", 1.0), _usage(1, "finished", 1.0)]
    health = health_of(records, "chat")
    assert health[1].requests == 101 and health[1].p99_ttft_ms == 98.0
    assert health[2].requests == 10 and health[2].error_rate == pytest.approx(0.3)


def test_judge_rolls_back_on_errors_or_ttft_and_promotes_after_the_interval():
    rollout = _canary(interval_s=10, step_started_at_s=0, min_requests=5)
    old = VersionHealth(requests=100, failed=1, p99_ttft_ms=100.0)
    assert judge(rollout, old, VersionHealth(10, 5, 90.0), 1)[0] is Verdict.ROLL_BACK
    assert judge(rollout, old, VersionHealth(10, 0, 200.0), 1)[0] is Verdict.ROLL_BACK
    assert judge(rollout, old, VersionHealth(10, 0, 120.0), 1)[0] is Verdict.WAIT
    assert judge(rollout, old, VersionHealth(10, 0, 120.0), 11)[0] is Verdict.PROMOTE
    assert judge(rollout, old, VersionHealth(2, 2, None), 11)[0] is Verdict.WAIT  # too few
