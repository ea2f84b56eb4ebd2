"""Validation of OpenAI request bodies: what is accepted, and what a 400 says to change."""

from __future__ import annotations

import pytest

from ebb.errors import InvalidRequest
from ebb.openai.schema import parse_chat_request, parse_completion_request


def chat(**overrides):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(overrides)
    return body


def completion(**overrides):
    body = {"model": "m", "prompt": "Once upon a time"}
    body.update(overrides)
    return body


def refused(parse, body) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        parse(body)
    assert info.value.status_code == 400
    return info.value


def test_minimal_chat_request():
    req = parse_chat_request(chat())
    assert req.model == "m"
    assert req.messages[0].role == "user"
    assert req.messages[0].content == "hi"
    assert req.stream is None and not req.include_usage


def test_full_chat_request_is_normalised():
    req = parse_chat_request(
        chat(
            messages=[
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": None, "tool_calls": None, "refusal": None},
                {"role": "user", "content": "c", "name": "bob"},
            ],
            temperature=0,
            top_p=0.5,
            max_completion_tokens=7,
            stop="END",
            seed=-3,
            presence_penalty=-2,
            frequency_penalty=2.0,
            n=2,
            logprobs=True,
            top_logprobs=20,
            stream=True,
            stream_options={"include_usage": True},
            user="someone",
            tools=None,
            logit_bias={},
            response_format={"type": "json_object"},
        )
    )
    assert [m.content for m in req.messages] == ["be brief", "a\nb", None, "c"]
    assert req.stop == ["END"]
    assert req.max_tokens_param == (7, "max_completion_tokens")
    assert req.include_usage
    assert req.response_format is not None and req.response_format.type == "json_object"


def test_json_schema_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    req = parse_chat_request(
        chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "thing", "schema": schema, "strict": True},
            }
        )
    )
    assert req.response_format.json_schema.schema_ == schema


def test_raw_json_bytes_are_accepted():
    req = parse_completion_request(b'{"model": "m", "prompt": ["only one"], "echo": false}')
    assert req.prompt == "only one"


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (chat(max_tokens=0), "max_tokens", "max_tokens must be at least 1; got 0"),
        (
            chat(max_completion_tokens=0),
            "max_completion_tokens",
            "max_completion_tokens must be at least 1; got 0",
        ),
        (chat(max_tokens=5, max_completion_tokens=6), "max_completion_tokens", "only one of"),
        (chat(max_tokens="5"), "max_tokens", 'max_tokens must be an integer; got "5"'),
        (chat(max_tokens=2.5), "max_tokens", "must be an integer"),
        (chat(temperature=2.5), "temperature", "temperature must be at most 2; got 2.5"),
        (chat(temperature=-1), "temperature", "at least 0"),
        (chat(temperature=True), "temperature", "must be a number; got true"),
        (chat(top_p=0), "top_p", "top_p must be greater than 0; got 0"),
        (chat(top_p=1.5), "top_p", "at most 1"),
        (chat(presence_penalty=3), "presence_penalty", "at most 2"),
        (chat(frequency_penalty=-2.5), "frequency_penalty", "at least -2"),
        (chat(n=0), "n", "n must be at least 1; got 0"),
        (chat(seed=2**64), "seed", "seed must be at most"),
        (chat(stop=["a", "b", "c", "d", "e"]), "stop", "at most 4 sequences; got 5"),
        (chat(stop=["a", ""]), "stop.1", "must not be empty"),
        (chat(stop=["a", 3]), "stop.1", "stop.1 must be a string; got 3"),
        (chat(stop=3), "stop", "stop must be a string or an array of strings; got 3"),
        (chat(top_logprobs=21, logprobs=True), "top_logprobs", "at most 20"),
        (chat(top_logprobs=2), "top_logprobs", "requires logprobs to be true"),
        (chat(logprobs=3), "logprobs", "logprobs must be a boolean; got 3"),
        (chat(stream_options={"include_usage": True}), "stream_options", "only allowed when"),
        (chat(stream=True, stream_options={"x": 1}), "stream_options.x", "Unrecognized field"),
        (chat(frobnicate=1), "frobnicate", "Unrecognized request argument supplied: frobnicate"),
        (chat(tools=[{"type": "function"}]), "tools.0.function", "Missing required"),
        (chat(logit_bias={"x": 1}), "logit_bias.x", "token ids written as strings"),
        (chat(model=""), "model", "must not be an empty string"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model", "Missing required"),
        (chat(messages=[]), "messages", "messages must not be empty"),
        (chat(messages="hi"), "messages", "messages must be an array"),
        (
            chat(messages=[{"role": "user", "content": "x"}, {"role": "user", "content": 5}]),
            "messages.1.content",
            "content must be a string or an array of text parts; got 5",
        ),
        (chat(messages=[{"role": "user"}]), "messages.0.content", "content is required"),
        (chat(messages=[{"role": "robot", "content": "x"}]), "messages.0.role", "'developer'"),
        (chat(messages=[{"role": "tool", "content": "x"}]), "messages.0.tool_call_id", "needs"),
        (chat(messages=[{"role": "function", "content": "x"}]), "messages.0.role", "use tools"),
        (
            chat(messages=[{"role": "user", "content": "x", "tool_calls": [{}]}]),
            "messages.0.tool_calls.0.id",
            "Missing required",
        ),
        (
            chat(messages=[{"role": "user", "content": "x", "mood": "happy"}]),
            "messages.0.mood",
            "Unrecognized field 'mood' in messages.0",
        ),
        (
            chat(
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "look"},
                            {"type": "image_url", "image_url": {"url": "http://x"}},
                        ],
                    }
                ]
            ),
            "messages.0.content.1",
            'parts of type "image_url" are not supported',
        ),
        (
            chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
            "messages.0.content.0",
            "a text part must be",
        ),
        (chat(response_format={"type": "xml"}), "response_format.type", "'json_schema'"),
        (
            chat(response_format={"type": "json_schema"}),
            "response_format.json_schema",
            "json_schema is required",
        ),
        (
            chat(
                response_format={
                    "type": "json_object",
                    "json_schema": {"name": "x", "schema": {"type": "object"}},
                }
            ),
            "response_format.json_schema",
            "only allowed with type",
        ),
        (
            chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
            "response_format.json_schema.schema",
            "schema is required",
        ),
        (
            chat(
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "array"}},
                }
            ),
            "response_format.json_schema.schema",
            '"type": "object"; got "array"',
        ),
        (
            chat(
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "bad name", "schema": {"type": "object"}},
                }
            ),
            "response_format.json_schema.name",
            "must match",
        ),
    ],
)
def test_chat_refusals(body, param, message):
    error = refused(parse_chat_request, body)
    assert error.param == param
    assert message in error.message


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (completion(prompt=["a", "b"]), "prompt", "one prompt per request"),
        (completion(prompt=[1, 2, 3]), "prompt", "token-id prompts are not supported"),
        (completion(prompt=[[1, 2], [3]]), "prompt", "token-id prompts are not supported"),
        (completion(prompt=[]), "prompt", "a string or a list of one string"),
        (completion(prompt=None), "prompt", "prompt must be a string; got null"),
        ({"model": "m"}, "prompt", "Missing required parameter: 'prompt'."),
        (completion(logprobs=6), "logprobs", "logprobs must be at most 5; got 6"),
        (completion(logprobs=True), "logprobs", "must be an integer; got true"),
        (completion(echo=True), "echo", "echoing the prompt is not supported"),
        (completion(best_of=3), "best_of", "use n"),
        (completion(messages=[]), "messages", "Unrecognized request argument supplied"),
        (completion(max_tokens=0), "max_tokens", "max_tokens must be at least 1; got 0"),
    ],
)
def test_completion_refusals(body, param, message):
    error = refused(parse_completion_request, body)
    assert error.param == param
    assert message in error.message


def test_neutral_unsupported_values_are_accepted():
    req = parse_completion_request(completion(echo=False, best_of=1, suffix=None, logit_bias=None))
    assert req.prompt == "Once upon a time"


@pytest.mark.parametrize(("body", "kind"), [([], "an array"), ("hi", "a string"), (None, "null")])
def test_non_object_body(body, kind):
    error = refused(parse_chat_request, body)
    assert error.param is None
    assert error.message == f"The request body must be a JSON object; got {kind}."


def test_invalid_json_bytes():
    error = refused(parse_chat_request, b"{not json")
    assert error.param is None
    assert "not valid JSON" in error.message


# Fields OpenAI documents as nullable, as SDKs send them when unset.
_NULLS = dict.fromkeys(
    (
        "stop",
        "max_tokens",
        "temperature",
        "top_p",
        "n",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "response_format",
        "stream",
        "stream_options",
        "user",
    )
)


def test_nullable_fields_may_be_null():
    chat = parse_chat_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi", "name": None}],
            **_NULLS,
            "max_completion_tokens": None,
            "logprobs": None,
            "top_logprobs": None,
            "tools": None,
        }
    )
    assert chat.stop is None and chat.max_tokens_param == (None, "max_tokens")
    completion = parse_completion_request({"model": "m", "prompt": "p", **_NULLS, "echo": None})
    assert completion.stop is None


def test_fields_of_current_clients_are_accepted():
    """Fields OpenAI's reference and vLLM's server document, which real clients send
    (guidellm's continuous_usage_stats, the SDK's include_obfuscation, ...): accepted."""
    streamed = parse_chat_request(
        chat(
            stream=True,
            stream_options={
                "include_usage": True,
                "continuous_usage_stats": True,
                "include_obfuscation": False,
            },
            verbosity="low",
            prompt_cache_key="session-42",
            safety_identifier="user-hash",
        )
    )
    assert streamed.include_usage and streamed.continuous_usage
    alone = parse_chat_request(chat(stream=True, stream_options={"continuous_usage_stats": True}))
    assert not alone.continuous_usage  # as vLLM: only beside include_usage
    completion_ok = parse_completion_request(
        completion(prompt_cache_key="k", safety_identifier="u")
    )
    assert completion_ok.prompt == "Once upon a time"
    assert refused(parse_chat_request, chat(verbosity="loud")).param == "verbosity"
