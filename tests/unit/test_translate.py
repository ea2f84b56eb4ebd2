"""The frontdoor's translation: requests into queue work, queue events into OpenAI replies."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from ebb.errors import InvalidRequest
from ebb.openai.response_builder import (
    SSE_DONE,
    EndpointKind,
    ResponseBuilder,
    new_request_id,
    sse_line,
)
from ebb.openai.schema import parse_chat_request, parse_completion_request
from ebb.openai.tokenizer import ByteTokenizer, HfPromptTokenizer
from ebb.openai.translate import COMPLETION_DEFAULT_MAX_TOKENS, prepare_chat, prepare_completion
from ebb.queue.schema import (
    DEFAULT_MAX_TOKENS,
    ChoiceDelta,
    Finished,
    Progress,
    ServingOptions,
    TokenLogprob,
    TopLogprob,
)

TOK = ByteTokenizer()
LIMITS = {"max_model_len": 64, "max_n": 4}


def chat_req(**overrides):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return parse_chat_request(body | overrides)


def completion_req(**overrides):
    return parse_completion_request({"model": "m", "prompt": "abc"} | overrides)


def refused(fn, *args, **kwargs) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        fn(*args, **kwargs)
    return info.value


# --- inbound ----------------------------------------------------------------------------


def test_chat_prompt_is_rendered_and_developer_becomes_system():
    req = chat_req(
        messages=[{"role": "developer", "content": "x"}, {"role": "user", "content": "y"}]
    )
    prepared = prepare_chat(req, TOK, **LIMITS)
    assert TOK.decode(prepared.prompt_token_ids) == "<|system|>x\n<|user|>y\n<|assistant|>"
    assert prepared.kind is EndpointKind.CHAT and prepared.model == "m"


def test_chat_defaults_fill_the_rest_of_the_context():
    prepared = prepare_chat(chat_req(), TOK, **LIMITS)
    spec = prepared.sampling
    assert spec.max_tokens == 64 - len(prepared.prompt_token_ids)
    assert (spec.temperature, spec.top_p, spec.n, spec.stop, spec.seed) == (1.0, 1.0, 1, [], None)
    assert (spec.presence_penalty, spec.frequency_penalty) == (0.0, 0.0)
    assert spec.logprobs is None and spec.json_schema is None and not spec.json_object
    assert not prepared.stream and not prepared.include_usage and not prepared.logprobs


def test_chat_sampling_mapping():
    req = chat_req(
        max_completion_tokens=5,
        temperature=0.5,
        top_p=0.9,
        n=3,
        stop=["\n\n", "END"],
        seed=7,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logprobs=True,
        top_logprobs=3,
        stream=True,
        stream_options={"include_usage": True},
        response_format={"type": "json_object"},
    )
    prepared = prepare_chat(req, TOK, **LIMITS)
    spec = prepared.sampling
    assert (spec.max_tokens, spec.temperature, spec.top_p, spec.n) == (5, 0.5, 0.9, 3)
    assert (spec.stop, spec.seed) == (["\n\n", "END"], 7)
    assert (spec.presence_penalty, spec.frequency_penalty) == (0.5, -0.5)
    assert spec.logprobs == 3 and spec.json_object and spec.json_schema is None
    assert prepared.stream and prepared.include_usage and prepared.logprobs


@pytest.mark.parametrize(
    ("overrides", "expected"), [({}, None), ({"logprobs": False}, None), ({"logprobs": True}, 0)]
)
def test_chat_logprobs_mapping(overrides, expected):
    prepared = prepare_chat(chat_req(**overrides), TOK, **LIMITS)
    assert prepared.sampling.logprobs == expected
    assert prepared.logprobs is (expected is not None)


@pytest.mark.parametrize("k", [0, 2, 5])
def test_completion_logprobs_mapping(k):
    prepared = prepare_completion(completion_req(logprobs=k), TOK, **LIMITS)
    assert prepared.sampling.logprobs == k and prepared.logprobs


def test_json_schema_is_passed_through():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    spec = prepare_chat(chat_req(response_format=fmt), TOK, **LIMITS).sampling
    assert spec.json_schema == schema and not spec.json_object


def test_completion_prompt_and_default_max_tokens():
    prepared = prepare_completion(completion_req(), TOK, **LIMITS)
    assert prepared.prompt_token_ids == list(b"abc")
    assert prepared.sampling.max_tokens == COMPLETION_DEFAULT_MAX_TOKENS
    assert prepared.kind is EndpointKind.COMPLETION
    # Near the end of the context the default shrinks rather than failing.
    near_full = prepare_completion(completion_req(prompt="x" * 60), TOK, **LIMITS)
    assert near_full.sampling.max_tokens == 4


def test_prompt_longer_than_context():
    error = refused(prepare_completion, completion_req(prompt="x" * 70), TOK, **LIMITS)
    assert error.param == "prompt"
    assert error.message.startswith(
        "This model's maximum context length is 64 tokens; your prompt has 70 tokens. "
        "Shorten the prompt"
    )


def test_prompt_filling_the_context_leaves_no_room():
    error = refused(prepare_completion, completion_req(prompt="x" * 64), TOK, **LIMITS)
    assert error.param == "prompt" and "at most 63 tokens" in error.message


def test_chat_prompt_longer_than_context():
    req = chat_req(messages=[{"role": "user", "content": "y" * 100}])
    error = refused(prepare_chat, req, TOK, **LIMITS)
    assert error.param == "messages" and "maximum context length is 64 tokens" in error.message


def test_a_chat_without_max_tokens_stops_at_the_deployments_default_not_the_context():
    big = {"max_model_len": 8192, "max_n": 4}
    assert prepare_chat(chat_req(), TOK, **big).sampling.max_tokens == DEFAULT_MAX_TOKENS
    own = ServingOptions(default_max_tokens=100)
    assert prepare_chat(chat_req(), TOK, **big, serving=own).sampling.max_tokens == 100
    capped = ServingOptions(default_max_tokens=100, max_tokens_limit=50)
    assert prepare_chat(chat_req(), TOK, **big, serving=capped).sampling.max_tokens == 50


def test_asking_past_the_deployments_max_tokens_limit_is_a_400_naming_the_limit():
    capped = ServingOptions(max_tokens_limit=50)
    big = {"max_model_len": 8192, "max_n": 4, "serving": capped}
    assert prepare_chat(chat_req(max_tokens=50), TOK, **big).sampling.max_tokens == 50
    error = refused(prepare_chat, chat_req(max_completion_tokens=51), TOK, **big)
    assert error.param == "max_completion_tokens"
    assert "at most 50 output tokens per request (serving.max_tokens_limit)" in error.message
    error = refused(prepare_completion, completion_req(max_tokens=51), TOK, **big)
    assert error.param == "max_tokens"


def test_max_tokens_beyond_what_is_left():
    prepared = prepare_completion(completion_req(max_tokens=61), TOK, **LIMITS)
    assert prepared.sampling.max_tokens == 61  # exactly fills the context
    error = refused(prepare_completion, completion_req(max_tokens=62), TOK, **LIMITS)
    assert error.param == "max_tokens"
    assert "your prompt has 3 tokens and max_tokens asks for 62 more" in error.message
    assert "Set max_tokens to at most 61" in error.message


def test_max_completion_tokens_is_named_in_the_refusal():
    error = refused(prepare_chat, chat_req(max_completion_tokens=1000), TOK, **LIMITS)
    assert error.param == "max_completion_tokens"
    assert "Set max_completion_tokens to at most" in error.message


def test_n_above_the_servers_bound():
    assert prepare_chat(chat_req(n=4), TOK, **LIMITS).sampling.n == 4
    error = refused(prepare_chat, chat_req(n=5), TOK, **LIMITS)
    assert error.param == "n" and "n must be at most 4 on this server; got 5" in error.message
    assert refused(prepare_completion, completion_req(n=9), TOK, **LIMITS).param == "n"


def test_empty_completion_prompt():
    error = refused(prepare_completion, completion_req(prompt=""), TOK, **LIMITS)
    assert error.param == "prompt"


def test_request_ids_carry_openai_prefixes():
    assert new_request_id(EndpointKind.CHAT).startswith("chatcmpl-")
    assert new_request_id(EndpointKind.COMPLETION).startswith("cmpl-")


def test_hf_tokenizer_from_dir(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "<|user|>", "<|system|>", "<|assistant|>", "hello", "world"]
    inner = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Like Llama's: encoding adds BOS, and the chat template writes it too.
    inner.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    template = (
        "{{ bos_token }}{% for m in messages %}"
        "{% if m.role == 'assistant' %}{{ raise_exception('no assistant turns') }}{% endif %}"
        "<|{{ m.role }}|> {{ m.content }} {% endfor %}<|assistant|>"
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=inner, unk_token="<unk>", bos_token="<s>", chat_template=template
    )
    hf.save_pretrained(tmp_path)

    tok = HfPromptTokenizer.from_dir(tmp_path)
    messages = [{"role": "system", "content": "hello"}, {"role": "user", "content": "world"}]
    assert tok.render_chat(messages) == [1, 3, 5, 2, 6, 4]  # one BOS, not two
    assert tok.encode("hello world") == [1, 5, 6]
    refusal = refused(tok.render_chat, [{"role": "assistant", "content": "hello"}])
    assert refusal.param == "messages" and "no assistant turns" in refusal.message

    no_template = HfPromptTokenizer(inner, template=None)
    assert "/v1/completions" in refused(no_template.render_chat, messages).message


# --- outbound ---------------------------------------------------------------------------


def lp(token: str, logprob: float, *top: tuple[str, float]) -> TokenLogprob:
    tops = [TopLogprob(t, p, list(t.encode())) for t, p in top]
    return TokenLogprob(token, logprob, list(token.encode()), tops)


def delta(index, text, finish=None, logprobs=None):
    count = len(logprobs) if logprobs else len(text)
    return ChoiceDelta(
        index=index, text=text, token_count=count, logprobs=logprobs, finish_reason=finish
    )


def builder(kind, **kwargs):
    kwargs = {"n": 1, "include_usage": False, "logprobs": False} | kwargs
    return ResponseBuilder(kind, request_id="req-1", model="m", created_s=1700000000, **kwargs)


FINISHED = Finished(prompt_tokens=12, completion_tokens=4)
USAGE = {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}


def test_chat_stream_with_two_choices_and_usage():
    b = builder(EndpointKind.CHAT, n=2, include_usage=True)
    chunks = b.chunks_for(Progress([delta(0, "Hel"), delta(1, "Yo")]))
    chunks += b.chunks_for(Progress([delta(0, "lo", finish="stop"), delta(1, "", finish="length")]))
    chunks += b.final_chunks(FINISHED)

    assert [c["choices"][0]["delta"] for c in chunks[:4]] == [
        {"role": "assistant", "content": "Hel"},
        {"role": "assistant", "content": "Yo"},
        {"content": "lo"},
        {},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:4]] == [None, None, "stop", "length"]
    assert all(c["usage"] is None for c in chunks[:4])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == USAGE
    for c in chunks:
        parsed = ChatCompletionChunk.model_validate(c)
        assert parsed.id == "req-1" and parsed.object == "chat.completion.chunk"
    assert ChatCompletionChunk.model_validate(chunks[-1]).usage.total_tokens == 16


def test_chat_stream_without_usage_has_no_usage_key():
    b = builder(EndpointKind.CHAT)
    chunks = b.chunks_for(Progress([delta(0, "Hi", finish="stop")]))
    assert b.final_chunks(FINISHED) == []
    assert len(chunks) == 1 and "usage" not in chunks[0]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "Hi"}


def test_invisible_deltas_are_not_sent():
    b = builder(EndpointKind.CHAT)
    assert b.chunks_for(Progress([delta(0, "")])) == []
    # The role still arrives with the first chunk a client sees.
    [chunk] = b.chunks_for(Progress([delta(0, "a")]))
    assert chunk["choices"][0]["delta"]["role"] == "assistant"


def test_chat_stream_logprobs():
    b = builder(EndpointKind.CHAT, logprobs=True)
    [chunk] = b.chunks_for(
        Progress([delta(0, "Hi", logprobs=[lp("Hi", -0.25, ("Hi", -0.25), ("Ho", float("-inf")))])])
    )
    content = ChatCompletionChunk.model_validate(chunk).choices[0].logprobs.content
    assert content[0].token == "Hi" and content[0].logprob == -0.25
    assert content[0].bytes == [72, 105]
    assert [(t.token, t.logprob) for t in content[0].top_logprobs] == [
        ("Hi", -0.25),
        ("Ho", -9999.0),
    ]
    [last] = b.chunks_for(Progress([delta(0, "", finish="stop", logprobs=[])]))
    assert last["choices"][0]["logprobs"] is None


def test_chat_non_stream_accumulates():
    b = builder(EndpointKind.CHAT, n=2, logprobs=True)
    b.add(
        Progress([delta(0, "A", logprobs=[lp("A", -1.0)]), delta(1, "B", logprobs=[lp("B", -2.0)])])
    )
    b.add(Progress([delta(0, "C", finish="length", logprobs=[lp("C", -0.5)])]))
    b.add(Progress([delta(1, "", finish="stop")]))
    body = b.response(FINISHED)
    parsed = ChatCompletion.model_validate(body)
    assert parsed.object == "chat.completion" and parsed.id == "req-1"
    assert [c.message.content for c in parsed.choices] == ["AC", "B"]
    assert [c.message.role for c in parsed.choices] == ["assistant", "assistant"]
    assert [c.finish_reason for c in parsed.choices] == ["length", "stop"]
    assert [t.token for t in parsed.choices[0].logprobs.content] == ["A", "C"]
    assert parsed.usage.model_dump(include=set(USAGE)) == USAGE


def test_chat_non_stream_without_logprobs():
    b = builder(EndpointKind.CHAT)
    b.add(Progress([delta(0, "ok", finish="stop")]))
    choice = b.response(FINISHED)["choices"][0]
    assert choice["logprobs"] is None and choice["message"] == {
        "role": "assistant",
        "content": "ok",
    }


def test_completion_stream_logprobs_and_offsets():
    b = builder(EndpointKind.COMPLETION, include_usage=True, logprobs=True)
    first = b.chunks_for(
        Progress([delta(0, "Hello", logprobs=[lp("Hel", -0.1, ("Hel", -0.1)), lp("lo", -0.2)])])
    )
    second = b.chunks_for(Progress([delta(0, " you", finish="stop", logprobs=[lp(" you", -0.3)])]))
    [usage_chunk] = b.final_chunks(FINISHED)

    logprobs = first[0]["choices"][0]["logprobs"]
    assert logprobs == {
        "tokens": ["Hel", "lo"],
        "token_logprobs": [-0.1, -0.2],
        "top_logprobs": [{"Hel": -0.1}, {}],
        "text_offset": [0, 3],
    }
    assert second[0]["choices"][0]["logprobs"]["text_offset"] == [5]
    assert second[0]["object"] == "text_completion" and second[0]["usage"] is None
    assert Completion.model_validate(second[0]).choices[0].finish_reason == "stop"
    parsed_usage = Completion.model_validate(usage_chunk)
    assert parsed_usage.choices == [] and parsed_usage.usage.completion_tokens == 4


def test_completion_non_stream():
    b = builder(EndpointKind.COMPLETION, n=2, logprobs=True)
    b.add(Progress([delta(0, "ab", logprobs=[lp("a", -1.0), lp("b", -1.0)]), delta(1, "z")]))
    b.add(Progress([delta(0, "c", "stop", [lp("c", -1.0)]), delta(1, "", "length")]))
    parsed = Completion.model_validate(b.response(FINISHED))
    assert parsed.object == "text_completion"
    assert [c.text for c in parsed.choices] == ["abc", "z"]
    assert parsed.choices[0].logprobs.text_offset == [0, 1, 2]
    assert parsed.choices[1].logprobs.tokens == []
    assert parsed.usage.total_tokens == 16


def test_choice_left_without_finish_reason_is_closed():
    b = builder(EndpointKind.CHAT, n=2)
    b.chunks_for(Progress([delta(0, "a", finish="stop"), delta(1, "b")]))
    [closing] = b.final_chunks(FINISHED)
    assert closing["choices"][0]["index"] == 1
    assert closing["choices"][0]["finish_reason"] == "stop"
    assert b.response(FINISHED)["choices"][1]["finish_reason"] == "stop"


def test_choice_index_outside_n_is_a_bug():
    with pytest.raises(ValueError, match="outside n=1"):
        builder(EndpointKind.CHAT).add(Progress([delta(1, "x")]))


def test_sse_framing():
    assert sse_line({"a": "é"}) == 'data: {"a":"é"}\n\n'.encode()
    assert SSE_DONE == b"data: [DONE]\n\n"


# --- through the official client ----------------------------------------------------------


def client_for(body: bytes, content_type: str) -> openai.OpenAI:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": content_type})

    http = httpx.Client(transport=httpx.MockTransport(handler))
    return openai.OpenAI(api_key="k", base_url="http://ebb.test/v1", http_client=http)


def sse_body(chunks) -> bytes:
    return b"".join(sse_line(c) for c in chunks) + SSE_DONE


def test_openai_client_reads_a_chat_stream():
    b = builder(EndpointKind.CHAT, n=2, include_usage=True)
    chunks = b.chunks_for(Progress([delta(0, "Hi"), delta(1, "Yo", finish="stop")]))
    chunks += b.chunks_for(Progress([delta(0, "!", finish="length")]))
    chunks += b.final_chunks(FINISHED)
    client = client_for(sse_body(chunks), "text/event-stream")
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "x"}],
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, finishes, usage = {0: "", 1: ""}, {}, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {0: "Hi!", 1: "Yo"} and finishes == {0: "length", 1: "stop"}
    assert usage is not None and usage.total_tokens == 16


def test_openai_client_reads_a_completion_stream_and_responses():
    b = builder(EndpointKind.COMPLETION)
    chunks = b.chunks_for(Progress([delta(0, "once"), delta(0, " more", finish="stop")]))
    client = client_for(sse_body(chunks + b.final_chunks(FINISHED)), "text/event-stream")
    stream = client.completions.create(model="m", prompt="x", stream=True)
    assert "".join(c.choices[0].text for c in stream) == "once more"

    response = json.dumps(b.response(FINISHED)).encode()
    completion = client_for(response, "application/json").completions.create(model="m", prompt="x")
    assert completion.choices[0].text == "once more" and completion.usage.prompt_tokens == 12

    chat = builder(EndpointKind.CHAT)
    chat.add(Progress([delta(0, "sure", finish="stop")]))
    body = json.dumps(chat.response(FINISHED)).encode()
    reply = client_for(body, "application/json").chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}]
    )
    assert reply.choices[0].message.content == "sure" and reply.usage.completion_tokens == 4


def test_several_greedy_choices_are_refused_with_a_way_out():
    from ebb.openai.schema import parse_chat_request
    from ebb.openai.tokenizer import ByteTokenizer
    from ebb.openai.translate import prepare_chat

    req = parse_chat_request(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2, "temperature": 0}
    )
    with pytest.raises(InvalidRequest) as refused:
        prepare_chat(req, ByteTokenizer(), max_model_len=512, max_n=8)
    assert refused.value.param == "n" and "temperature" in refused.value.message


def test_continuous_usage_puts_the_usage_so_far_on_every_chunk():
    b = builder(EndpointKind.CHAT, include_usage=True, continuous_usage_prompt_tokens=12)
    chunks = b.chunks_for(Progress([delta(0, "Hel")]))
    chunks += b.chunks_for(Progress([delta(0, "lo", finish="stop")]))
    chunks += b.final_chunks(FINISHED)
    assert [c["usage"]["completion_tokens"] for c in chunks[:2]] == [3, 5]
    assert all(c["usage"]["prompt_tokens"] == 12 for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == USAGE  # the engine's counts
