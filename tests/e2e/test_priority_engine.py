"""vLLM's own scheduler orders by ebb's priority classes (real engine, default model): a
critical request added behind a full batch of sheddable ones runs in the first step."""

from __future__ import annotations

import pytest

from ebb.queue.priority import rank
from ebb.queue.schema import SamplingSpec
from ebb.runners.engine import EngineOptions

pytestmark = pytest.mark.e2e

SLOTS = 2


@pytest.fixture(scope="module")
def engine(default_local_model):
    from ebb.runners.engine_vllm import VllmEngine

    options = EngineOptions(
        model_path=default_local_model.path,
        max_model_len=min(default_local_model.max_model_len, 1024),
        max_num_seqs=SLOTS,
        kv_cache_gib=1,
    )
    engine = VllmEngine.load(options)
    yield engine
    engine.shutdown()


def test_a_critical_request_is_scheduled_before_sheddable_ones_that_came_first(engine):
    sampling = SamplingSpec(max_tokens=16, temperature=0, ignore_eos=True)
    for i in range(SLOTS):
        engine.add_request(f"shed-{i}", [1, 2, 3, 4], sampling, priority=rank("sheddable"))
    engine.add_request("crit", [5, 6, 7, 8], sampling, priority=rank("critical"))
    first_outputs: list[str] = []
    while not first_outputs:
        first_outputs = [o.request_id for o in engine.step() if o.choices]
    # FCFS would fill both slots with the sheddable requests and leave it waiting.
    assert "crit" in first_outputs
    while engine.has_unfinished():
        engine.step()


def test_a_critical_request_waits_for_a_place_in_a_running_full_batch(engine):
    """What the fake engine models, and why a runner leaves places in its engine's batch
    for critical work (ebb.queue.priority.engine_batch_limit): vLLM preempts a running
    sequence only when the KV cache runs out, never for a waiting request's place."""
    sampling = SamplingSpec(max_tokens=16, temperature=0, ignore_eos=True)
    busy = {f"busy-{i}" for i in range(SLOTS)}
    for request_id in sorted(busy):
        engine.add_request(request_id, [1, 2, 3, 4], sampling, priority=rank("sheddable"))
    produced: set[str] = set()
    while produced != busy:
        produced |= {o.request_id for o in engine.step() if o.choices}
    critical = SamplingSpec(max_tokens=2, temperature=0, ignore_eos=True)
    engine.add_request("crit-late", [5, 6, 7, 8], critical, priority=rank("critical"))
    step, first_busy_end, critical_first = 0, None, None
    while engine.has_unfinished():
        step += 1
        for output in engine.step():
            if output.request_id in busy and output.finished and first_busy_end is None:
                first_busy_end = step
            if output.request_id == "crit-late" and output.choices and critical_first is None:
                critical_first = step
    assert first_busy_end is not None and critical_first is not None
    assert critical_first > first_busy_end
