"""The fake engine batches as vLLM's v1 scheduler does with `scheduling_policy="priority"`
(vllm/v1/core/sched/scheduler.py): at most `max_num_seqs` requests run; free places go to
the most urgent waiting request, then the earliest; a waiting request never displaces a
running one for its place, whatever its class. Tests that measure priority through the
fake engine (bench.priority) rely on it not being kinder to critical work than vLLM."""

from __future__ import annotations

from ebb.queue.priority import rank
from ebb.queue.schema import SamplingSpec
from ebb.runners.engine import EngineOptions
from ebb.testing.fake_engine import FakeEngine
from ebb.testing.fake_model import FakeModel

SAMPLING = SamplingSpec(max_tokens=4)


def engine(max_num_seqs: int | None) -> FakeEngine:
    return FakeEngine(FakeModel.parse("fake://m?step_ms=0"), max_num_seqs=max_num_seqs)


def producing(outputs) -> set[str]:
    return {o.request_id for o in outputs if o.choices}


def test_a_critical_request_behind_a_full_batch_waits_for_a_place_to_free():
    e = engine(2)
    e.add_request("shed-0", [1], SAMPLING, priority=rank("sheddable"))
    e.add_request("shed-1", [1], SamplingSpec(max_tokens=2), priority=rank("sheddable"))
    assert producing(e.step()) == {"shed-0", "shed-1"}
    e.add_request("crit", [1], SAMPLING, priority=rank("critical"))
    # The batch is full: no preemption for a place, the critical one waits...
    assert producing(e.step()) == {"shed-0", "shed-1"}
    # ...until shed-1 has ended (its 2 tokens), then it runs beside shed-0.
    assert producing(e.step()) == {"shed-0", "crit"}
    assert e.running_ids() == {"shed-0", "crit"}


def test_free_places_go_to_the_most_urgent_waiting_request_then_the_earliest():
    e = engine(1)
    e.add_request("std-early", [1], SamplingSpec(max_tokens=1), priority=rank("standard"))
    e.add_request("shed", [1], SamplingSpec(max_tokens=1), priority=rank("sheddable"))
    e.add_request("std-late", [1], SamplingSpec(max_tokens=1), priority=rank("standard"))
    e.add_request("crit", [1], SamplingSpec(max_tokens=1), priority=rank("critical"))
    order = [next(iter(producing(e.step()))) for _ in range(4)]
    assert order == ["crit", "std-early", "std-late", "shed"]
    assert not e.has_unfinished()


def test_a_waiting_request_aborted_never_runs_and_frees_nothing_it_did_not_hold():
    e = engine(1)
    e.add_request("a", [1], SamplingSpec(max_tokens=3))
    e.add_request("b", [1], SamplingSpec(max_tokens=1))
    e.step()
    e.abort(["b"])
    assert [producing(e.step()) for _ in range(2)] == [{"a"}, {"a"}]
    assert not e.has_unfinished() and e.aborted == ["b"]


def test_the_engine_takes_its_batch_limit_from_the_engine_options():
    options = EngineOptions(model_path=None, max_model_len=2048, source="fake://m", max_num_seqs=3)
    assert FakeEngine.load(options).max_num_seqs == 3
    assert engine(None).max_num_seqs is None  # built directly: no limit


def test_a_step_takes_longer_with_more_requests_in_the_batch(monkeypatch):
    # step_ms_per_seq: TPOT grows with the batch, as on a real engine (bench.step_load).
    slept: list[float] = []
    monkeypatch.setattr("ebb.testing.fake_engine.time.sleep", slept.append)
    e = FakeEngine(FakeModel.parse("fake://m?step_ms=10&step_ms_per_seq=2"), max_num_seqs=3)
    for i in range(4):
        e.add_request(f"r{i}", [1], SamplingSpec(max_tokens=1 + i))
    e.step()  # three run, one waits for a place
    e.step()  # r0 ended: r1, r2 and r3
    e.step()  # r1 ended: r2 and r3
    # Each step: its fixed part, then its part per request in the batch.
    assert slept == [0.01, 0.006, 0.01, 0.006, 0.01, 0.004]
