"""vLLM's extra sampling parameters and logit_bias: validation, and what reaches the queue."""

from __future__ import annotations

import pytest

from ebb.errors import InvalidRequest
from ebb.openai.schema import parse_chat_request, parse_completion_request
from ebb.openai.tokenizer import ByteTokenizer
from ebb.openai.translate import prepare_chat, prepare_completion

TOK = ByteTokenizer()
LIMITS = {"max_model_len": 64, "max_n": 4}


def chat(**extra):
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}]} | extra


def refused(fn, *args, **kwargs) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        fn(*args, **kwargs)
    assert info.value.status_code == 400
    return info.value


def test_extras_reach_the_sampling_spec():
    req = parse_chat_request(
        chat(
            top_k=-1,
            min_p=0.1,
            repetition_penalty=1.3,
            min_tokens=3,
            max_tokens=10,
            stop_token_ids=[10, 0],
            allowed_token_ids=[65, 66],
            ignore_eos=True,
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
            include_stop_str_in_output=True,
            logit_bias={"65": 100, "66": -100.0},
            length_penalty=1.0,
            use_beam_search=False,
        )
    )
    spec = prepare_chat(req, TOK, **LIMITS).sampling
    assert (spec.top_k, spec.min_p, spec.repetition_penalty, spec.min_tokens) == (0, 0.1, 1.3, 3)
    assert spec.stop_token_ids == [10, 0] and spec.allowed_token_ids == [65, 66]
    assert spec.ignore_eos and spec.include_stop_str_in_output
    assert not spec.skip_special_tokens and not spec.spaces_between_special_tokens
    assert spec.logit_bias == {65: 100.0, 66: -100.0}


def test_absent_extras_keep_vllm_defaults():
    spec = prepare_completion(
        parse_completion_request({"model": "m", "prompt": "abc"}), TOK, **LIMITS
    ).sampling
    assert (spec.top_k, spec.min_p, spec.repetition_penalty, spec.min_tokens) == (0, 0.0, 1.0, 0)
    assert spec.stop_token_ids == [] and spec.allowed_token_ids is None
    assert spec.skip_special_tokens and not spec.ignore_eos and spec.logit_bias == {}


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"top_k": -2}, "top_k", "top_k must be at least -1; got -2"),
        ({"top_k": 1.5}, "top_k", "top_k must be an integer"),
        ({"min_p": 1.5}, "min_p", "min_p must be at most 1"),
        ({"repetition_penalty": 0}, "repetition_penalty", "greater than 0"),
        ({"min_tokens": -1}, "min_tokens", "at least 0"),
        ({"stop_token_ids": [1, -3]}, "stop_token_ids.1", "at least 0; got -3"),
        ({"stop_token_ids": "1"}, "stop_token_ids", "must be an array"),
        ({"allowed_token_ids": []}, "allowed_token_ids", "must not be empty"),
        ({"skip_special_tokens": 1}, "skip_special_tokens", "must be a boolean"),
        ({"logit_bias": {"5": 101}}, "logit_bias.5", "between -100 and 100"),
        ({"logit_bias": {"-5": 1}}, "logit_bias.-5", "token ids written as strings"),
        ({"logit_bias": {"5": "up"}}, "logit_bias.5", "must be a number"),
        ({"length_penalty": 0.5}, "length_penalty", "only to beam search"),
        ({"use_beam_search": True}, "use_beam_search", "beam search is not supported"),
        ({"top_kk": 3}, "top_kk", "Unrecognized request argument supplied: top_kk"),
    ],
)
def test_bad_extras_name_the_parameter(extra, param, message):
    for body in (chat(**extra), {"model": "m", "prompt": "x"} | extra):
        parse = parse_chat_request if "messages" in body else parse_completion_request
        error = refused(parse, body)
        assert error.param == param
        assert message in error.message


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logit_bias": {"256": 5}}, "logit_bias"),
        ({"stop_token_ids": [3, 300]}, "stop_token_ids"),
        ({"allowed_token_ids": [999]}, "allowed_token_ids"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_refused(extra, param):
    error = refused(prepare_chat, parse_chat_request(chat(**extra)), TOK, **LIMITS)
    assert error.param == param
    assert "outside this model's vocabulary (ids 0 to 255)" in error.message


def test_min_tokens_above_the_budget_is_refused():
    error = refused(
        prepare_chat, parse_chat_request(chat(min_tokens=9, max_tokens=8)), TOK, **LIMITS
    )
    assert error.param == "min_tokens"
    assert "min_tokens (9)" in error.message and "max_tokens" in error.message
