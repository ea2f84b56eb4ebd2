"""Tool calls: parsing replies (whole and streamed), planning requests, building replies."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from ebb.errors import InvalidRequest
from ebb.openai.response_builder import EndpointKind, ResponseBuilder
from ebb.openai.schema import parse_chat_request
from ebb.openai.tokenizer import ByteTokenizer
from ebb.openai.tool_calls import ToolStream, parse, parser_for_template
from ebb.openai.translate import prepare_chat
from ebb.queue.schema import ChoiceDelta, Finished, Progress, ServingOptions, ToolCallFormat

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "strict": True}}
AUTO = ToolCallFormat(mode="auto")
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def chat(**extra):
    return {"model": "m", "messages": [{"role": "user", "content": "weather?"}]} | extra


@pytest.mark.parametrize(
    ("text", "parser", "content", "calls"),
    [
        (f"Let me look.\n{HERMES_CALL}", "hermes", "Let me look.", [("get_weather", "Paris")]),
        (HERMES_CALL + HERMES_CALL.replace("Paris", "Rome"), "hermes", None, 2),
        ("<tool_call>{not json}</tool_call>", "hermes", "<tool_call>{not json}</tool_call>", 0),
        ("Just words.", "hermes", "Just words.", 0),
        (
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
            "llama3_json",
            None,
            [("get_weather", "Paris")],
        ),
        (
            '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}',
            "llama3_json",
            None,
            2,
        ),
        ("It is {sunny}", "llama3_json", "It is {sunny}", 0),
        (
            'Sure [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
            "mistral",
            "Sure",
            [("get_weather", "Paris")],
        ),
    ],
)
def test_auto_parsers(text, parser, content, calls):
    got_content, got_calls = parse(text, ToolCallFormat(mode="auto", parser=parser))
    assert got_content == content
    if isinstance(calls, int):
        assert len(got_calls) == calls
    else:
        assert [(c.name, json.loads(c.arguments)["city"]) for c in got_calls] == calls
    assert len({c.call_id for c in got_calls}) == len(got_calls)


def test_forced_replies_parse_as_calls():
    required = ToolCallFormat(mode="required")
    _, calls = parse('[{"name": "get_weather", "parameters": {"city": "Oslo"}}]', required)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]
    _, calls = parse(' {"city": "Oslo"}', ToolCallFormat(mode="named", function="get_weather"))
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Oslo"}')]
    _, calls = parse(HERMES_CALL * 2, ToolCallFormat(mode="auto", parallel=False))
    assert len(calls) == 1


def test_parser_defaults_follow_the_chat_template():
    assert parser_for_template("{{ '<tool_call>' }}") == "hermes"
    assert parser_for_template("{{ '<|python_tag|>' }}") == "llama3_json"
    assert parser_for_template("[TOOL_CALLS]") == "mistral"
    assert parser_for_template("") == "hermes"


def test_streamed_content_stops_where_a_call_may_begin():
    stream = ToolStream(AUTO)
    sent, calls = [], []
    text = "Checking. " + HERMES_CALL
    for piece in [text[i : i + 3] for i in range(0, len(text), 3)]:
        content, new_calls = stream.feed(piece)
        sent.append(content)
        calls += new_calls
    content, last = stream.finish()
    assert "".join(sent) + content == "Checking. ", "nothing of the call may leak as content"
    assert last == [], "the call was streamed before the reply ended"
    assert calls[0]["index"] == 0 and calls[0]["function"] == {
        "name": "get_weather",
        "arguments": "",
    }
    assert all(c["index"] == 0 and "id" not in c for c in calls[1:])
    arguments = "".join(c["function"]["arguments"] for c in calls)
    assert json.loads(arguments) == {"city": "Paris"} and len(calls) > 3


def test_streamed_text_with_a_marker_prefix_is_released():
    stream = ToolStream(AUTO)
    assert stream.feed("a <tool") == ("a ", [])
    assert stream.feed("kit") == ("<toolkit", [])
    assert stream.finish() == ("", [])


def test_named_call_streams_its_arguments():
    stream = ToolStream(ToolCallFormat(mode="named", function="get_weather"))
    first = stream.feed('{"city"')[1]
    rest = stream.feed(': "Oslo"}')[1]
    assert first[0]["id"].startswith("call_") and first[0]["function"]["name"] == "get_weather"
    assert "id" not in rest[0]
    args = first[0]["function"]["arguments"] + rest[0]["function"]["arguments"]
    assert json.loads(args) == {"city": "Oslo"}


def test_request_plans():
    tok = ByteTokenizer()
    limits = {"max_model_len": 4096, "max_n": 4}
    named = prepare_chat(
        parse_chat_request(
            chat(
                tools=[WEATHER],
                tool_choice={"type": "function", "function": {"name": "get_weather"}},
            )
        ),
        tok,
        **limits,
    )
    assert named.sampling.json_schema == WEATHER["function"]["parameters"]
    assert named.tools == ToolCallFormat(mode="named", function="get_weather")

    required = prepare_chat(
        parse_chat_request(
            chat(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
        ),
        tok,
        **limits,
    )
    schema = required.sampling.json_schema
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    names = [c["properties"]["name"]["enum"] for c in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]

    auto = prepare_chat(parse_chat_request(chat(tools=[WEATHER, TIME])), tok, **limits)
    assert auto.tools == ToolCallFormat(mode="auto", parser="hermes")
    assert auto.sampling.json_schema is None
    tag = json.loads(auto.sampling.structural_tag)
    assert [s["begin"] for s in tag["structures"]] == [
        '<tool_call>\n{"name": "get_time", "arguments": '
    ], "only strict functions are constrained"
    prompt = tok.decode(auto.prompt_token_ids)
    assert prompt.startswith("<|system|>You may call functions") and "get_weather" in prompt

    none = prepare_chat(
        parse_chat_request(chat(tools=[WEATHER], tool_choice="none")), tok, **limits
    )
    assert none.tools is None and "get_weather" not in tok.decode(none.prompt_token_ids)


def test_conversation_with_calls_and_results_renders():
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    req = parse_chat_request(
        chat(
            tools=[WEATHER],
            messages=[
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
        )
    )
    prompt = ByteTokenizer().decode(
        prepare_chat(req, ByteTokenizer(), max_model_len=4096, max_n=1).prompt_token_ids
    )
    call_text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert f"<|assistant|><tool_call>{call_text}</tool_call>" in prompt
    assert "<|tool|>sunny\n" in prompt


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (chat(tool_choice="required"), "tool_choice", "tools is empty"),
        (chat(tools=[WEATHER], tool_choice="sometimes"), "tool_choice", '"none", "auto"'),
        (
            chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
            "tool_choice",
            "does not declare",
        ),
        (chat(tools=[WEATHER, WEATHER]), "tools", "same function name twice"),
        (
            chat(
                tools=[
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
                ]
            ),
            "tools.0.function.parameters",
            '"type": "object"',
        ),
        (
            chat(tools=[{"type": "function", "function": {"name": "bad name"}}]),
            "tools.0.function.name",
            "must match",
        ),
        (
            chat(messages=[{"role": "assistant", "content": "x", "tool_call_id": "c"}]),
            "messages.0.tool_call_id",
            "only 'tool' messages",
        ),
        (chat(functions=[{"name": "f"}]), "functions", "use tools and tool_choice"),
    ],
)
def test_bad_tool_requests(body, param, message):
    with pytest.raises(InvalidRequest) as info:
        parse_chat_request(body)
    assert info.value.param == param
    assert message in info.value.message


def test_forced_tools_and_response_format_conflict():
    req = parse_chat_request(
        chat(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"})
    )
    with pytest.raises(InvalidRequest) as info:
        prepare_chat(req, ByteTokenizer(), max_model_len=4096, max_n=1)
    assert info.value.param == "response_format"


def test_auto_tools_off_for_the_deployment():
    req = parse_chat_request(chat(tools=[WEATHER]))
    with pytest.raises(InvalidRequest) as info:
        prepare_chat(
            req,
            ByteTokenizer(),
            max_model_len=4096,
            max_n=1,
            serving=ServingOptions(tool_parser="none"),
        )
    assert info.value.param == "tool_choice" and "turned off" in info.value.message


def _builder(fmt: ToolCallFormat) -> ResponseBuilder:
    return ResponseBuilder(
        EndpointKind.CHAT, request_id="chatcmpl-1", model="m", created_s=1, n=1, tools=fmt
    )


def test_response_with_tool_calls_validates_as_openai():
    builder = _builder(AUTO)
    builder.add(
        Progress([ChoiceDelta(index=0, text=HERMES_CALL, token_count=5, finish_reason="stop")])
    )
    reply = ChatCompletion.model_validate(builder.response(Finished(3, 5)))
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Paris"}

    named = _builder(ToolCallFormat(mode="named", function="get_weather"))
    named.add(
        Progress(
            [ChoiceDelta(index=0, text='{"city": "Oslo"}', token_count=5, finish_reason="stop")]
        )
    )
    choice = ChatCompletion.model_validate(named.response(Finished(3, 5))).choices[0]
    assert (
        choice.finish_reason == "stop"
        and choice.message.tool_calls[0].function.name == "get_weather"
    )


def test_streamed_tool_calls_validate_and_assemble():
    builder = _builder(AUTO)
    chunks = []
    for i, piece in enumerate(["Ok. ", HERMES_CALL[:9], HERMES_CALL[9:]]):
        last = i == 2
        delta = ChoiceDelta(
            index=0, text=piece, token_count=1, finish_reason="stop" if last else None
        )
        chunks += builder.chunks_for(Progress([delta]))
    chunks += builder.final_chunks(Finished(3, 3))
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    content = "".join(c.choices[0].delta.content or "" for c in parsed)
    calls = [tc for c in parsed for tc in c.choices[0].delta.tool_calls or []]
    assert content == "Ok. "
    assert {c.index for c in calls} == {0} and calls[0].function.name == "get_weather"
    assert json.loads("".join(c.function.arguments for c in calls)) == {"city": "Paris"}
    assert parsed[-1].choices[0].finish_reason == "tool_calls"


# --- incremental tool-call streams, assembled by the official SDK -------------------------


def _sdk_assembled(fmt: ToolCallFormat, text: str, piece_chars: int):
    """`text` streamed `piece_chars` at a time through the builder, into the openai SDK's
    stream accumulator: (final message, argument-delta events seen before the last chunk)."""
    from openai.lib.streaming.chat import ChatCompletionStreamState

    builder = _builder(fmt)
    state = ChatCompletionStreamState()
    pieces = [text[i : i + piece_chars] for i in range(0, len(text), piece_chars)]
    early = 0
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        delta = ChoiceDelta(
            index=0, text=piece, token_count=1, finish_reason="stop" if last else None
        )
        for chunk in builder.chunks_for(Progress([delta])):
            events = list(state.handle_chunk(ChatCompletionChunk.model_validate(chunk)))
            if not last:
                early += sum(e.type == "tool_calls.function.arguments.delta" for e in events)
    for chunk in builder.final_chunks(Finished(3, len(pieces))):
        list(state.handle_chunk(ChatCompletionChunk.model_validate(chunk)))
    return state.get_final_completion().choices[0], early


LLAMA_TWO = '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}'
MISTRAL_ONE = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'
REQUIRED_TWO = (
    '[{"name": "get_weather", "parameters": {"city": "Oslo"}}, '
    '{"name": "get_time", "parameters": {"zone": "CET"}}]'
)
TRICKY = (
    '<tool_call>{"name": "search", "arguments": {"q": "a \\"}\\" {b} [c]", "n": [1, {"k": 2}]}}'
    "</tool_call>"
)


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (AUTO, f"Let me look.\n{HERMES_CALL}"),
        (AUTO, HERMES_CALL + HERMES_CALL.replace("Paris", "Rome")),
        (AUTO, TRICKY),
        (AUTO, '<tool_call>{"arguments": {"city": "Oslo"}, "name": "get_weather"}</tool_call>'),
        (AUTO, '<tool_call>{"name": "get_time"}</tool_call> Done.'),
        (ToolCallFormat(mode="auto", parser="llama3_json"), LLAMA_TWO),
        (ToolCallFormat(mode="auto", parser="mistral"), f"Sure {MISTRAL_ONE}"),
        (ToolCallFormat(mode="required"), REQUIRED_TWO),
        (ToolCallFormat(mode="auto", parallel=False), HERMES_CALL * 2),
    ],
)
@pytest.mark.parametrize("piece_chars", [1, 4, 1000])
def test_streamed_calls_assemble_as_the_whole_reply_parses(fmt, text, piece_chars):
    choice, early = _sdk_assembled(fmt, text, piece_chars)
    content, calls = parse(text, fmt)
    streamed = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in streamed] == [
        (c.name, json.loads(c.arguments)) for c in calls
    ]
    assert all(c.id.startswith("call_") and c.type == "function" for c in streamed)
    assert len({c.id for c in streamed}) == len(streamed)
    # Content before a call streams as it comes (the whole reply trims it).
    assert ((choice.message.content or "").strip() or None) == content
    assert choice.finish_reason == "tool_calls"
    if piece_chars == 1 and '"arguments": {"city": "Oslo"}, "name"' not in text:
        assert early > 1, "arguments arrived in one piece at the end instead of streaming"


def test_a_malformed_call_streams_as_content():
    text = "<tool_call>{not json}</tool_call>"
    choice, early = _sdk_assembled(AUTO, text, 2)
    assert choice.message.content == text and not choice.message.tool_calls
    assert choice.finish_reason == "stop" and early == 0


def test_a_call_cut_short_keeps_what_was_streamed():
    stream = ToolStream(AUTO)
    _, calls = stream.feed('<tool_call>{"name": "get_weather", "arguments": {"city": "Pa')
    _, more = stream.finish()
    assert calls[0]["function"]["name"] == "get_weather"
    arguments = "".join(c["function"]["arguments"] for c in calls + more)
    assert arguments == '{"city": "Pa'


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (ToolCallFormat(mode="required"), '[{"name": "get_weather", "parameters": {"city": "Os'),
        (AUTO, '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa'),
    ],
)
def test_a_call_cut_off_by_max_tokens_is_a_tool_call_streamed_or_not(fmt, text):
    """A forced call that hits max_tokens answers as tool_calls with the arguments as far
    as they got and finish_reason "length", never the guided-decoding JSON as content."""
    whole = _builder(fmt)
    whole.add(Progress([ChoiceDelta(index=0, text=text, token_count=9, finish_reason="length")]))
    choice = ChatCompletion.model_validate(whole.response(Finished(3, 9))).choices[0]
    assert choice.finish_reason == "length"
    assert not (choice.message.content or "").strip()
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]

    streamed = _builder(fmt)
    chunks = streamed.chunks_for(
        Progress([ChoiceDelta(index=0, text=text, token_count=9, finish_reason="length")])
    )
    deltas = [
        tc
        for chunk in chunks
        for tc in ChatCompletionChunk.model_validate(chunk).choices[0].delta.tool_calls or []
    ]
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert arguments == choice.message.tool_calls[0].function.arguments
