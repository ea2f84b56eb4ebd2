"""bench.autoscale_floor: the cold-start waits no policy starting from zero avoids, the
waits any policy without a forecast pays, and where a result's waits came from."""

from dataclasses import replace

from bench.autoscale_floor import (
    by_minute,
    cold_waits,
    fastest_start_s,
    measure_floor,
    unavoidable_waits,
)
from ebb.coldstart.simulation import RunnerModel, ScalingSettings, TraceRequest, simulate

MODEL = RunnerModel()  # stems and forks start in 2 s, fresh processes in 10 s


def _at(*arrivals_s: float, output_tokens: int = 50) -> list[TraceRequest]:
    return [TraceRequest(a, 100, output_tokens) for a in arrivals_s]


def test_requests_before_the_first_runner_could_be_ready_are_unavoidable():
    trace = _at(5.0, 5.5, 6.99, 7.0, 30.0)
    assert unavoidable_waits(trace, 2.0) == 3  # 5.0, 5.5 and 6.99: before 5.0 + 2 s
    assert unavoidable_waits(trace, 10.0) == 4
    assert unavoidable_waits([], 2.0) == 0


def test_the_fastest_start_is_the_quickest_tier_the_platform_has():
    assert fastest_start_s(ScalingSettings(), MODEL) == 2.0
    bare = ScalingSettings(prewarm=0, fork_server=False)
    assert fastest_start_s(bare, MODEL) == MODEL.fresh_start_s == 10.0
    assert fastest_start_s(replace(bare, fork_server=True), MODEL) == 2.0


def test_waits_are_counted_by_the_minute_they_arrived_in():
    assert by_minute([0.0, 59.9, 60.0, 185.0, 3.0]) == {0: 3, 1: 1, 3: 1}
    assert by_minute([]) == {}


def test_a_rise_to_a_new_level_costs_the_reactive_floor_less_than_the_delayed_queue_rule():
    # One runner (8 slots) busy with long requests, then two more a second: the ninth
    # concurrent request needs a second runner, a level never needed before.
    first = [0.0] + [4.0 + 0.25 * i for i in range(7)]
    rise = [10.0 + 0.5 * i for i in range(20)]
    trace = _at(*first, *rise, output_tokens=1000)
    settings = ScalingSettings(max_replicas=4, target_concurrency=8, idle_timeout_s=5.0)
    fixed = simulate(trace, settings, MODEL)
    floor = measure_floor(trace, settings, MODEL)
    assert floor.unavoidable == 1  # only the first: the next arrives after 2 s
    # Instant scale-up waits one start at the rise; the queue rule's 2 s delay waits longer.
    assert floor.unavoidable < floor.reactive < cold_waits(fixed)
    assert set(floor.reactive_by_minute) == {0}
    assert sum(by_minute(fixed.cold_wait_arrivals_s).values()) == cold_waits(fixed)


def test_the_reactive_floor_gives_no_runner_back():
    # Two bursts 100 s apart: a 5 s window goes to zero between them and waits again;
    # the floor's runner is still there for the second.
    trace = _at(0.0, 0.1, 100.0, 100.1)
    settings = ScalingSettings(max_replicas=2, idle_timeout_s=5.0)
    fixed = simulate(trace, settings, MODEL)
    floor = measure_floor(trace, settings, MODEL)
    assert cold_waits(fixed) == 4
    assert floor.reactive == floor.unavoidable == 2
    assert floor.reactive_runner_s > fixed.runner_seconds
