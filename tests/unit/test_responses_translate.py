"""A Responses request as the chat completions request that serves it, and the Response
object built from the chat answer."""

from __future__ import annotations

import pytest

from ebb.errors import InvalidRequest
from ebb.openai.responses_objects import ResponseFrame, from_chat_completion
from ebb.openai.responses_schema import parse_responses_request
from ebb.openai.responses_translate import (
    chat_body,
    echoed_fields,
    in_responses_terms,
    input_items,
    to_messages,
)
from ebb.openai.schema import parse_chat_request

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}


def _request(**fields):
    return parse_responses_request({"model": "m", "input": "hi", **fields})


def test_a_string_input_is_one_user_message_after_the_instructions():
    req = _request(instructions="Be brief.", max_output_tokens=5, temperature=0.5)
    items = input_items(req)
    body = chat_body(req, [], items)
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert body["max_completion_tokens"] == 5 and body["temperature"] == 0.5
    assert items[0]["id"].startswith("msg_")
    parse_chat_request(body)  # a body the chat path takes as it is


def test_tools_choice_and_format_take_their_chat_names():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    req = _request(
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
        parallel_tool_calls=False,
    )
    body = chat_body(req, [], input_items(req))
    function = dict(TOOL)
    del function["type"]
    assert body["tools"] == [{"type": "function", "function": function}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }
    assert body["parallel_tool_calls"] is False
    parse_chat_request(body)
    echoed = echoed_fields(req)
    assert echoed["tools"] == [TOOL] and echoed["text"]["format"]["name"] == "out"
    assert echoed["tool_choice"] == {"type": "function", "name": "get_weather"}


def test_function_calls_join_the_assistant_turn_and_outputs_are_tool_messages():
    context = [
        {"type": "message", "role": "user", "content": "weather?", "id": "msg_1"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call", "call_id": "call_b", "name": "g", "arguments": "{}"},
    ]
    outputs = [
        {"type": "function_call_output", "call_id": "call_a", "output": "1"},
        {"type": "function_call_output", "call_id": "call_b", "output": "2"},
    ]
    messages = to_messages(context + outputs)
    assert messages == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"x": 1}'},
                },
                {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "1"},
        {"role": "tool", "tool_call_id": "call_b", "content": "2"},
    ]
    # A call with no text before it opens an assistant message of its own.
    assert to_messages(context[2:3])[0] == {
        "role": "assistant",
        "content": None,
        "tool_calls": messages[1]["tool_calls"][:1],
    }


def test_streaming_asks_the_chat_stream_for_its_usage():
    req = _request(stream=True)
    body = chat_body(req, [], input_items(req))
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "file_search"}]}, "tools.0"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input.0"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input.0.content.0"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"truncation": "auto"}, "truncation"),
        ({"metadata": {"k": "v" * 513}}, "metadata.k"),
        ({"background": True, "store": False}, "store"),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input.0.arguments"),
        ({"seed": 1}, "seed"),
        # Kept with a stored response but never tokenised: bounded.
        ({"user": "u" * 257}, "user"),
        ({"input": [{"role": "user", "content": "hi", "id": "i" * 257}]}, "input.0.id"),
        ({"input": [{"type": "item_reference", "id": "i" * 257}]}, "input.0.id"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c" * 257, "output": ""}]},
            "input.0.call_id",
        ),
        (
            {
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "x",
                        "schema": {},
                        "description": "d" * 8193,
                    }
                }
            },
            "text.format.description",
        ),
        (
            {
                "text": {
                    "format": {"type": "json_schema", "name": "x", "schema": {"d": "d" * 262_144}}
                }
            },
            "text.format.schema",
        ),
    ],
)
def test_refusals_name_the_field(body, param):
    with pytest.raises(InvalidRequest) as info:
        parse_responses_request({"model": "m", "input": "hi", **body})
    assert info.value.param == param, info.value.message


def test_neutral_values_of_unsupported_fields_are_accepted():
    req = _request(truncation="disabled", include=[], reasoning=None, service_tier="auto")
    assert req.stored and not req.background


def test_chat_refusals_are_renamed_to_the_responses_fields():
    error = InvalidRequest(
        "Set max_completion_tokens to at most 10, or shorten the prompt.",
        param="max_completion_tokens",
    )
    renamed = in_responses_terms(error)
    assert renamed.param == "max_output_tokens" and "max_output_tokens" in renamed.message
    error = InvalidRequest("bad", param="tools.0.function.parameters")
    assert in_responses_terms(error).param == "tools.0.parameters"


def test_the_response_from_a_chat_completion():
    frame = ResponseFrame("resp_1", "m", 7, {"metadata": {"a": "b"}})
    completion = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "message": {
                    "role": "assistant",
                    "content": "Let me",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a'},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    response = from_chat_completion(frame, completion)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    message, call = response["output"]
    assert message["content"][0]["text"] == "Let me" == response["output_text"]
    assert call["call_id"] == "call_1" and call["arguments"] == '{"a' and call["name"] == "f"
    assert response["usage"] == {
        "input_tokens": 3,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 4,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 7,
    }
    assert response["metadata"] == {"a": "b"}
    # The frame read back from the object rebuilds it at another status.
    assert ResponseFrame.of(response).response("queued") == frame.response("queued")


def test_an_output_items_id_names_its_response():
    from ebb.openai.responses_objects import output_item_id, response_of_item

    response_id = "resp_" + "ab" * 16
    assert response_of_item(output_item_id("fc", response_id, 3)) == response_id
    assert response_of_item(output_item_id("msg", response_id, 0)) == response_id
    assert response_of_item("msg_" + "0" * 32) is None  # an input item's (random) id
    assert response_of_item("rs_whatever") is None


def test_input_items_keep_what_the_model_reads_of_a_text_part():
    """An echoed output_text's annotations and logprobs are never tokenised: not stored."""
    part = {"type": "output_text", "text": "Paris.", "annotations": ["x" * 1000], "logprobs": []}
    req = _request(input=[{"role": "assistant", "content": [part]}])
    (item,) = input_items(req)
    assert item["content"] == [{"type": "output_text", "text": "Paris."}]
    call = {
        "type": "function_call_output",
        "call_id": "c",
        "output": [{**part, "type": "input_text"}],
    }
    (item,) = input_items(_request(input=[call]))
    assert item["output"] == [{"type": "input_text", "text": "Paris."}]
