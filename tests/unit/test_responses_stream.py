"""The Responses events a chat completion's chunks make (the state machine alone)."""

from __future__ import annotations

import json

from ebb.openai.responses_objects import ResponseFrame
from ebb.openai.responses_stream import ResponseEvents, sse


def _chunk(content=None, tool_calls=None, finish_reason=None, usage=None, choices=True):
    delta = {}
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    body = {"object": "chat.completion.chunk", "usage": usage}
    body["choices"] = (
        [{"index": 0, "delta": delta, "finish_reason": finish_reason}] if choices else []
    )
    return body


USAGE = {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


def _run(chunks, events=None):
    events = events or ResponseEvents(ResponseFrame("resp_x", "m", 1))
    out = events.start()
    for chunk in chunks:
        out += events.feed(chunk)
    return events, out + events.finish()


def test_text_opens_a_message_streams_deltas_and_closes_it():
    events, out = _run(
        [
            _chunk(content=""),  # the role-only first chunk: nothing to show yet
            _chunk(content="Hel"),
            _chunk(content="lo", finish_reason="stop"),
            _chunk(usage=USAGE, choices=False),
        ]
    )
    assert [e["type"] for e in out] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    added = out[2]["item"]
    assert added["status"] == "in_progress" and added["content"] == []
    assert out[4]["delta"] == "Hel" and out[4]["item_id"] == added["id"]
    assert out[6]["text"] == "Hello" and out[8]["item"]["status"] == "completed"
    final = out[-1]["response"]
    assert final["status"] == "completed" and final["output_text"] == "Hello"
    assert final["usage"]["input_tokens"] == 4 and final["usage"]["output_tokens"] == 3
    assert events.response == final


def test_text_then_two_calls_each_its_own_item():
    call_a = {
        "index": 0,
        "id": "call_a",
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    call_b = {
        "index": 1,
        "id": "call_b",
        "type": "function",
        "function": {"name": "g", "arguments": ""},
    }
    _, out = _run(
        [
            _chunk(content="Sure."),
            _chunk(tool_calls=[call_a]),
            _chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"x":'}}]),
            _chunk(tool_calls=[{"index": 0, "function": {"arguments": " 1}"}}]),
            _chunk(tool_calls=[call_b, {"index": 1, "function": {"arguments": "{}"}}]),
            _chunk(finish_reason="tool_calls"),
        ]
    )
    types = [e["type"] for e in out]
    # The message closes before the first call opens.
    assert types.index("response.output_item.done") < types.index(
        "response.function_call_arguments.delta"
    )
    done = [e for e in out if e["type"] == "response.function_call_arguments.done"]
    assert [(d["name"], d["arguments"], d["output_index"]) for d in done] == [
        ("f", '{"x": 1}', 1),
        ("g", "{}", 2),
    ]
    final = out[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["message", "function_call", "function_call"]
    assert [i.get("call_id") for i in final["output"][1:]] == ["call_a", "call_b"]
    assert final["status"] == "completed"


def test_cut_off_by_length_is_incomplete():
    _, out = _run([_chunk(content="abc", finish_reason="length")])
    assert out[-1]["type"] == "response.incomplete"
    final = out[-1]["response"]
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"


def test_a_failure_closes_what_is_open_then_errors():
    events = ResponseEvents(ResponseFrame("resp_x", "m", 1))
    events.start()
    events.feed(_chunk(content="par"))
    error = {"error": {"message": "runner lost", "code": "runner_lost", "param": None}}
    out = events.fail(error)
    assert [e["type"] for e in out][-2:] == ["error", "response.failed"]
    assert out[-2]["code"] == "runner_lost" and out[-2]["message"] == "runner lost"
    failed = out[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "runner_lost"
    assert failed["output"][0]["content"][0]["text"] == "par"


def test_sse_names_the_event_type():
    line = sse({"type": "response.created", "sequence_number": 0})
    head, data = line.decode().split("\n")[:2]
    assert head == "event: response.created"
    assert json.loads(data.removeprefix("data: ")) == {
        "type": "response.created",
        "sequence_number": 0,
    }
    assert line.endswith(b"\n\n")
