"""Continuation by token replay, the pure parts: what a stream's output so far is, what is
left to sample, and the fake engine going on from replayed tokens as if never stopped."""

from __future__ import annotations

import pytest

from ebb.queue.continuation import output_so_far, remaining_sampling
from ebb.queue.schema import ChoiceDelta, Claimed, Continued, Progress, SamplingSpec
from ebb.runners.engine import EngineOptions
from ebb.testing.fake_engine import FakeEngine


def delta(text: str, index: int = 0, finish=None) -> ChoiceDelta:
    ids = list(text.encode())
    return ChoiceDelta(
        index=index, text=text, token_count=len(ids), token_ids=ids, finish_reason=finish
    )


def test_output_so_far_is_what_readers_kept():
    events = [
        Claimed("a"),
        Progress([delta("Pa")], seq=1),
        Progress([delta("Pa")], seq=1),  # a retried write, landed twice
        Continued(1),
        Progress([delta("zz")], seq=2),  # the lost runner, writing late
        Claimed("b"),
        Progress([delta("ri")], seq=1, attempt=1),
    ]
    so_far = output_so_far(events)
    assert so_far.token_ids == list(b"Pari")
    assert (so_far.completion_tokens, so_far.attempt, so_far.replayable) == (4, 1, True)
    assert so_far.finish_reason is None


def test_output_of_several_choices_or_without_token_ids_cannot_be_replayed():
    assert not output_so_far([Progress([delta("a"), delta("b", index=1)])]).replayable
    bare = ChoiceDelta(index=0, text="a", token_count=1)
    assert not output_so_far([Progress([bare])]).replayable


def test_the_rest_is_sampled_with_what_is_left_of_max_and_min_tokens():
    sampling = SamplingSpec(max_tokens=10, min_tokens=5, seed=7, temperature=0.0)
    rest = remaining_sampling(sampling, output_so_far([Progress([delta("abcdef")])]))
    assert (rest.max_tokens, rest.min_tokens, rest.seed) == (4, 0, 7)


def _run(engine: FakeEngine, request_id: str) -> tuple[list[ChoiceDelta], int, int]:
    deltas, prompt, completion = [], 0, 0
    while engine.has_unfinished():
        for out in engine.step():
            deltas += out.choices
            prompt, completion = out.prompt_tokens, out.completion_tokens
    return deltas, prompt, completion


@pytest.mark.parametrize("stop", [[], ["Paris"]])
@pytest.mark.parametrize("cut", [1, 7, 25])
def test_the_fake_engine_goes_on_from_replayed_tokens_as_if_never_stopped(stop, cut):
    prompt = list(b"Where is the capital of France?")
    sampling = SamplingSpec(max_tokens=40, temperature=0.0, logprobs=1, stop=stop)
    whole = FakeEngine.load(
        EngineOptions(model_path=None, max_model_len=2048, source="fake://m?step_ms=0")
    )
    whole.add_request("r", prompt, sampling)
    expected, _, _ = _run(whole, "r")
    head = expected[:cut]
    so_far = output_so_far([Progress(head)])
    rest_engine = FakeEngine.load(
        EngineOptions(model_path=None, max_model_len=2048, source="fake://m?step_ms=0")
    )
    rest_engine.add_request(
        "r", prompt + so_far.token_ids, remaining_sampling(sampling, so_far), cut
    )
    rest, prompt_tokens, completion_tokens = _run(rest_engine, "r")
    assert head + rest == expected
    assert prompt_tokens == len(prompt) + cut
    assert completion_tokens == sum(d.token_count for d in expected) - cut
