"""The GPU-second split: every ledger entry's uses add up to its metered gpu_ms, exactly."""

from __future__ import annotations

import random

from ebb.billing.entries import book_gpu
from ebb.billing.gpu_split import USE_METRICS, USES, PhaseClock, allocate, use_of
from ebb.queue.ledger import HOUR_MS
from ebb.queue.metering import GpuMeter, GpuSegment
from ebb.queue.schema import RunnerState


def test_allocate_is_exact_whole_and_proportional() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        total = rng.randrange(0, 10**7)
        weights = {u: rng.choice([0, rng.randrange(1, 10**6)]) for u in USES}
        parts = allocate(total, weights)
        assert sum(parts.values()) == total
        assert all(n >= 0 for n in parts.values())
        whole = sum(weights.values())
        for use, w in weights.items():
            if whole:
                assert abs(parts[use] - total * w / whole) < 1
    assert allocate(10, {"serving": 1, "idle": 1, "loading": 1}) == {
        "serving": 4,
        "loading": 3,
        "idle": 3,
        "asleep": 0,
        "wasted": 0,
    }


def test_time_no_runner_accounted_for_is_wasted() -> None:
    assert allocate(500, {}) == {"serving": 0, "loading": 0, "idle": 0, "asleep": 0, "wasted": 500}


def test_a_segment_across_hours_splits_each_entry_exactly() -> None:
    meter = GpuMeter(runner_id="r1", deployment="d", tenant="t", gpu_count=3)
    start = 5 * HOUR_MS - 1234
    seg = GpuSegment(
        meter=meter,
        start_ms=start,
        end_ms=start + HOUR_MS + 7777,
        uses_ms={"serving": 333, "idle": 333, "loading": 1, "asleep": 2},
    )
    entries = book_gpu("1-0", seg, 0)
    assert len(entries) == 3
    for entry in entries:
        assert sum(entry.counts[m] for m in USE_METRICS) == entry.counts["gpu_ms"]
    assert sum(e.counts["gpu_ms"] for e in entries) == seg.duration_ms * 3
    assert sum(e.counts["gpu_wasted_ms"] for e in entries) == 0


def test_an_unaccounted_segment_books_as_wasted() -> None:
    meter = GpuMeter(runner_id="r1", deployment="d", tenant="t")
    (entry,) = book_gpu("1-0", GpuSegment(meter=meter, start_ms=10, end_ms=1010), 0)
    assert entry.counts["gpu_wasted_ms"] == 1000 == entry.counts["gpu_ms"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_phase_clock_counts_each_use_between_takes() -> None:
    t = FakeClock()
    clock = PhaseClock(t)
    clock.enter("loading")
    t.now = 2.0
    clock.enter(use_of(RunnerState.READY, holding=False))
    t.now = 3.0
    clock.enter(use_of(RunnerState.READY, holding=True))
    t.now = 3.5
    clock.enter(use_of(RunnerState.SLEEPING, holding=False))
    t.now = 4.0
    assert clock.take() == {"loading": 2000, "idle": 1000, "serving": 500, "asleep": 500}
    t.now = 5.0
    assert clock.take(final=True) == {"asleep": 1000}


def test_a_runner_that_never_served_wastes_its_whole_undecided_time() -> None:
    t = FakeClock()
    clock = PhaseClock(t)
    clock.enter("loading")
    t.now = 3.0
    clock.enter("idle")
    t.now = 10.0
    assert clock.idle_s() == 7.0
    assert clock.take(final=True) == {"wasted": 10000}


def test_uses_of_states() -> None:
    assert use_of(RunnerState.LOADING, holding=True) == "loading"
    assert use_of(RunnerState.DRAINING, holding=True) == "serving"
    assert use_of(RunnerState.DRAINING, holding=False) == "idle"
    assert use_of(RunnerState.PREWARMED, holding=False) == "idle"
    assert use_of(RunnerState.SLEEPING, holding=False) == "asleep"


def test_cost_rows_add_up_and_count_idle_and_waste_in() -> None:
    from ebb.billing.gpu_costs import gpu_cost_rows, unsplit_gpu_ms

    hour = 3 * HOUR_MS
    aggregates = {
        hour: {
            "acme|m|gpu_ms": 10_000,
            "acme|m|gpu_serving_ms": 4_000,
            "acme|m|gpu_loading_ms": 3_000,
            "acme|m|gpu_idle_ms": 2_000,
            "acme|m|gpu_wasted_ms": 1_000,
            "acme|m|completion_tokens": 1_000,
            "beta|m|gpu_ms": 7,
            "beta|m|gpu_idle_ms": 6,
        }
    }
    (row,) = gpu_cost_rows(aggregates, 0, 10 * HOUR_MS, "acme", gpu_second_cost_micros=1_000)
    assert sum(row["gpu_ms_by_use"].values()) == row["gpu_ms"] == 10_000
    assert row["tokens_per_gpu_second"] == 100.0
    assert row["tokens_per_serving_gpu_second"] == 250.0
    # 10 GPU-s at 0.001 (10_000 micros) for 1000 tokens: 10.00 per 1M, 20 % idle, 10 % waste.
    assert row["gpu_cost_micros_per_1m_output_tokens"] == 10_000_000
    by_use = row["gpu_cost_micros_per_1m_output_tokens_by_use"]
    assert by_use["idle"] == 2_000_000 and by_use["wasted"] == 1_000_000
    assert sum(by_use.values()) == 10_000_000
    assert unsplit_gpu_ms(aggregates) == [(hour, "beta|m", 6, 7)]


class RecordingScript:
    def __init__(self) -> None:
        self.calls: list[list[object]] = []

    def __call__(self, keys: list[str], args: list[object]) -> int:
        self.calls.append(args)
        return 0


class ScriptClient:
    def __init__(self) -> None:
        self.script = RecordingScript()

    def register_script(self, source: str) -> RecordingScript:
        return self.script


def test_a_runner_holds_its_time_back_only_until_it_first_serves() -> None:
    from ebb.billing.gpu import RunnerMeter
    from ebb.queue.schema import DeploymentSpec

    client = ScriptClient()
    spec = DeploymentSpec(name="d", source="fake://d", idle_timeout_s=600)
    meter = RunnerMeter(
        client,  # type: ignore[arg-type]
        "r1",
        interval_s=3600,
        read_spec=lambda name: spec,
        gpus=1,
    )
    meter.begin(spec)
    assert meter.holding_back()  # loading: it may yet be wasted
    meter.observe(RunnerState.READY, holding=True)
    assert not meter.holding_back()  # it served: its time is written as it goes
    meter.close()
    [begin, close] = client.script.calls
    assert begin[0] == 0  # at launch: who pays, no segment
    assert close[3] == "1" and b"wasted" not in close[4]


def test_a_stem_that_leaves_the_pool_unassigned_was_idle_not_wasted() -> None:
    from ebb.billing.gpu import RunnerMeter

    client = ScriptClient()
    meter = RunnerMeter(
        client,  # type: ignore[arg-type]
        "stem",
        interval_s=3600,
        read_spec=lambda name: None,
        gpus=0,
    )
    meter.begin(None)
    assert not meter.holding_back()  # pre-warmed capacity is kept on purpose
    meter.close()
    close = client.script.calls[-1]
    assert b"wasted" not in close[4] and b"idle" in close[4]


def test_a_min_replicas_runner_writes_its_time_as_it_goes() -> None:
    from ebb.billing.gpu import RunnerMeter
    from ebb.queue.schema import DeploymentSpec

    client = ScriptClient()
    spec = DeploymentSpec(name="d", source="fake://d", idle_timeout_s=600, min_replicas=1)
    meter = RunnerMeter(
        client,  # type: ignore[arg-type]
        "r1",
        interval_s=3600,
        read_spec=lambda name: spec,
        gpus=1,
    )
    meter.begin(spec)
    assert not meter.holding_back()  # kept on purpose: its loading is loading
    meter.close()
    assert b"wasted" not in client.script.calls[-1][4]
