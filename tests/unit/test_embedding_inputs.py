"""Several embedding inputs in one work item: split for the engine, reported as one."""

from __future__ import annotations

import pytest

from ebb.queue.schema import SamplingSpec
from ebb.runners.embedding_inputs import EmbeddingInputs
from ebb.runners.engine import EngineRequestError
from ebb.testing.fake_engine import FakeEngine, fake_embedding
from ebb.testing.fake_model import FakeModel


def _engine() -> EmbeddingInputs:
    return EmbeddingInputs(FakeEngine(FakeModel.parse("fake://m?step_ms=0"), pooling=True))


def _run(engine: EmbeddingInputs) -> list:
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    return outputs


def test_inputs_come_back_as_the_choices_of_one_request():
    engine = _engine()
    sampling = SamplingSpec(max_tokens=1, embed=True, embed_input_lengths=[2, 3, 2])
    engine.add_request("job.1", [1, 2, 3, 4, 5, 1, 2], sampling)
    engine.add_request("sync", [9, 9], SamplingSpec(max_tokens=1, embed=True))
    outputs = _run(engine)
    (job,) = [o for o in outputs if o.request_id == "job.1"]
    (sync,) = [o for o in outputs if o.request_id == "sync"]
    assert job.finished and job.prompt_tokens == 7 and job.completion_tokens == 0
    vectors = {c.index: c.embedding for c in job.choices}
    assert vectors == {
        0: fake_embedding([1, 2], None),
        1: fake_embedding([3, 4, 5], None),
        2: fake_embedding([1, 2], None),
    }
    assert sync.finished and sync.choices[0].embedding == fake_embedding([9, 9], None)


def test_lengths_that_do_not_cut_the_prompt_are_refused():
    engine = _engine()
    with pytest.raises(EngineRequestError, match="do not cut"):
        engine.add_request(
            "j", [1, 2, 3], SamplingSpec(max_tokens=1, embed=True, embed_input_lengths=[1, 1])
        )
    assert not engine.has_unfinished()


def test_an_aborted_request_aborts_every_input():
    engine = _engine()
    sampling = SamplingSpec(max_tokens=1, embed=True, embed_input_lengths=[1, 1])
    engine.add_request("j", [1, 2], sampling)
    engine.abort(["j"])
    assert not engine.has_unfinished() and engine.step() == []
