"""The APIs clients use beside chat, on the fake engine: the Responses API driven by the
official client's `client.responses` (text, streaming, function tools over two turns,
structured output, the stored response's reads, tenancy, background responses, billing),
and vLLM's POST /tokenize and /detokenize."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from support import Platform, deploy, temp_home, wait_until
from support.billing import new_key, tenant_client, usage_total

from ebb.testing.fake_model import FAKE_JSON_REPLY, FAKE_REPLY

pytestmark = pytest.mark.integration

QUESTION = "What is the capital of France?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def platform():
    p = Platform(home=temp_home("ebb-it-resp-"), redis_url=None).start()
    yield p
    assert p.stop() == 0


@pytest.fixture(scope="module")
def client(platform, admin):
    deploy(admin, "fake", source="fake://m?ctx=4096", idle_timeout_s=600)
    return platform.openai()


@pytest.fixture(scope="module")
def tenant_clients(platform, admin, client):
    """Two tenants' clients (each with its own key) calling the admin's public model."""
    return tuple(platform.openai(api_key=new_key(admin, name)) for name in ("resp-a", "resp-b"))


def test_text_in_text_out_with_usage(client):
    response = client.responses.create(
        model="fake", input=QUESTION, instructions="Answer briefly.", max_output_tokens=12
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == FAKE_REPLY[:12]
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.instructions == "Answer briefly." and response.max_output_tokens == 12
    usage = response.usage
    assert usage.output_tokens == 12 and usage.input_tokens > len(QUESTION)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0


def test_completed_when_the_model_stops(client):
    response = client.responses.create(
        model="fake",
        input=[{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}],
        text={"format": {"type": "json_object"}},
    )
    assert response.status == "completed" and response.incomplete_details is None
    assert json.loads(response.output_text) == json.loads(FAKE_JSON_REPLY)


def test_streamed_events_through_the_stream_helper(client):
    json_object = {"format": {"type": "json_object"}}
    with client.responses.stream(model="fake", input=QUESTION, text=json_object) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    for kind in (
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ):
        assert kind in types, kind
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text == FAKE_JSON_REPLY
    assert final.usage.output_tokens == len(text)


def test_a_stream_cut_off_by_max_output_tokens_ends_incomplete(client):
    events = list(
        client.responses.create(model="fake", input=QUESTION, max_output_tokens=10, stream=True)
    )
    assert events[-1].type == "response.incomplete"
    final = events[-1].response
    assert final.incomplete_details.reason == "max_output_tokens"
    assert final.output_text == FAKE_REPLY[:10] and final.usage.output_tokens == 10
    assert final.output[0].status == "incomplete"


def test_stream_true_ends_with_completed_and_sse_event_lines(platform, client):
    stream = client.responses.create(
        model="fake", input=QUESTION, stream=True, text={"format": {"type": "json_object"}}
    )
    events = list(stream)
    assert events[-1].type == "response.completed"
    assert json.loads(events[-1].response.output_text) == json.loads(FAKE_JSON_REPLY)
    body = {"model": "fake", "input": QUESTION, "stream": True, "max_output_tokens": 3}
    headers = {"Authorization": f"Bearer {platform.admin_key}"}
    raw = httpx.post(platform.base_url + "/v1/responses", json=body, headers=headers, timeout=60)
    assert raw.text.startswith("event: response.created\ndata: {")
    assert "[DONE]" not in raw.text and "\nid: " not in raw.text
    # A client that asks (X-Ebb-Resumable) gets an id on every event (<response id>:<n>),
    # as chat's do.
    headers["X-Ebb-Resumable"] = "1"
    raw = httpx.post(platform.base_url + "/v1/responses", json=body, headers=headers, timeout=60)
    response_id = raw.headers["x-request-id"]
    assert raw.text.startswith(f"id: {response_id}:0\nevent: response.created\ndata: {{")


def test_a_streamed_response_is_continued_as_soon_as_it_ended(client):
    """It is stored before its last event goes out, so the next turn finds it at once."""
    for _ in range(3):
        events = list(
            client.responses.create(model="fake", input=QUESTION, max_output_tokens=2, stream=True)
        )
        first = events[-1].response
        second = client.responses.create(
            model="fake", input="And then?", previous_response_id=first.id, max_output_tokens=2
        )
        assert second.usage.input_tokens > first.usage.input_tokens


def test_function_call_then_its_output_by_previous_response_id(client):
    first = client.responses.create(model="fake", input=QUESTION, tools=[WEATHER])
    assert first.status == "completed"
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert json.loads(call.arguments) == {"answer": "Paris"}

    second = client.responses.create(
        model="fake",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER],
        max_output_tokens=12,
    )
    # The tool's result came back, so the model answers in words (the fake engine's rule).
    assert second.output_text == FAKE_REPLY[:12]
    assert second.previous_response_id == first.id
    # The whole conversation went in: longer than the first turn's prompt.
    assert second.usage.input_tokens > first.usage.input_tokens


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "get_weather"}])
def test_forced_function_calls_streamed(client, tool_choice):
    stream = client.responses.create(
        model="fake", input=QUESTION, tools=[WEATHER], tool_choice=tool_choice, stream=True
    )
    events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads("".join(deltas)) == json.loads(done.arguments) == {"answer": "Paris"}
    (call,) = events[-1].response.output
    assert call.type == "function_call" and call.name == "get_weather"


def test_json_schema_format_parses(client):
    from pydantic import BaseModel

    class Answer(BaseModel):
        answer: str

    parsed = client.responses.parse(model="fake", input=QUESTION, text_format=Answer)
    assert parsed.output_parsed == Answer(answer="Paris")
    assert parsed.text.format.type == "json_schema"


def test_retrieve_input_items_and_delete(client):
    created = client.responses.create(
        model="fake", input=QUESTION, max_output_tokens=4, metadata={"conversation": "c-1"}
    )
    got = client.responses.retrieve(created.id)
    assert got.output_text == created.output_text and got.metadata == {"conversation": "c-1"}
    (item,) = client.responses.input_items.list(created.id).data
    assert item.type == "message" and item.role == "user" and item.id
    assert item.content[0].type == "input_text" and item.content[0].text == QUESTION
    deleted = client.responses.delete(created.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)


def test_store_false_is_not_kept(client):
    created = client.responses.create(
        model="fake", input=QUESTION, max_output_tokens=2, store=False
    )
    assert created.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="fake", input="more", previous_response_id=created.id)
    assert info.value.body["param"] == "previous_response_id"


def test_another_tenants_response_is_404(tenant_clients):
    a, b = tenant_clients
    mine = a.responses.create(model="fake", input=QUESTION, max_output_tokens=3)
    assert a.responses.retrieve(mine.id).id == mine.id
    for call in (
        lambda: b.responses.retrieve(mine.id),
        lambda: b.responses.input_items.list(mine.id),
        lambda: b.responses.delete(mine.id),
        lambda: b.responses.create(model="fake", input="x", previous_response_id=mine.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert a.responses.retrieve(mine.id).id == mine.id  # b's delete removed nothing


def test_background_response_is_billed_once(platform, admin, client):
    key = new_key(admin, "resp-bg")
    tenant = platform.openai(api_key=key)
    queued = tenant.responses.create(
        model="fake", input=QUESTION, background=True, max_output_tokens=6
    )
    assert queued.status in ("queued", "in_progress") and queued.background is True

    def settled():
        response = tenant.responses.retrieve(queued.id)
        return response if response.status not in ("queued", "in_progress") else None

    done = wait_until(settled, 60, "the background response to settle")
    assert done.status == "incomplete" and done.output_text == FAKE_REPLY[:6]
    with httpx.Client(
        base_url=platform.base_url, headers={"Authorization": f"Bearer {key}"}
    ) as http:
        total = usage_total(http)["total"]
    assert total["requests"] == 1
    assert total["completion_tokens"] == done.usage.output_tokens == 6
    assert total["prompt_tokens"] == done.usage.input_tokens
    # Settled: cancelling changes nothing.
    assert tenant.responses.cancel(queued.id).status == "incomplete"


def test_a_sync_response_is_billed_once(platform, admin):
    key = new_key(admin, "resp-sync")
    tenant = platform.openai(api_key=key)
    streamed = tenant.responses.create(
        model="fake", input=QUESTION, max_output_tokens=5, stream=True
    )
    final = list(streamed)[-1].response
    whole = tenant.responses.create(model="fake", input=QUESTION, max_output_tokens=7)
    with httpx.Client(
        base_url=platform.base_url, headers={"Authorization": f"Bearer {key}"}
    ) as http:
        total = wait_until(
            lambda: (t := usage_total(http)["total"])["requests"] == 2 and t,
            30,
            "both requests in the usage",
        )
    assert total["completion_tokens"] == 5 + 7
    assert total["prompt_tokens"] == final.usage.input_tokens + whole.usage.input_tokens


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": QUESTION, "temprature": 1}, "temprature"),
        ({"input": QUESTION, "tools": [{"type": "web_search"}]}, "tools.0"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input.0.content.0"),
        ({"input": QUESTION, "reasoning": {"effort": "high"}}, "reasoning"),
        ({"input": QUESTION, "max_output_tokens": 999999}, "max_output_tokens"),
        ({"input": QUESTION, "background": True, "stream": True}, "stream"),
    ],
)
def test_bad_requests_are_400_naming_the_field(client, body, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/responses", body={"model": "fake", **body}, cast_to=httpx.Response)
    assert info.value.body["param"] == param, info.value.body


# --- /tokenize and /detokenize ------------------------------------------------------------


def test_tokenize_a_prompt_and_back(admin, client):
    tokenized = admin.post("/tokenize", json={"model": "fake", "prompt": "Paris é"})
    assert tokenized.status_code == 200, tokenized.text
    body = tokenized.json()
    assert body["tokens"] == list("Paris é".encode())  # the fake model's byte tokenizer
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 4096
    plain = {"model": "fake", "prompt": "Paris é", "add_special_tokens": False}
    assert admin.post("/tokenize", json=plain).json()["tokens"] == body["tokens"]
    back = admin.post("/detokenize", json={"model": "fake", "tokens": body["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": "Paris é"}


def test_tokenize_messages_counts_what_chat_sends(admin, client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for extra in ({}, {"tools": tools}):
        counted = admin.post("/tokenize", json={"model": "fake", "messages": messages, **extra})
        assert counted.status_code == 200, counted.text
        chat = client.chat.completions.create(
            model="fake", messages=messages, max_tokens=1, **extra
        )
        assert counted.json()["count"] == chat.usage.prompt_tokens


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"model": "fake"}, "prompt"),
        (
            "/tokenize",
            {"model": "fake", "prompt": "x", "return_token_strs": True},
            "return_token_strs",
        ),
        ("/tokenize", {"model": "fake", "messages": [{"role": "user"}]}, "messages.0.content"),
        ("/tokenize", {"model": "fake", "prompt": "x", "extra": 1}, "extra"),
        ("/tokenize", {"model": "fake", "messages": [], "add_special_tokens": True}, "messages"),
        (
            "/tokenize",
            {
                "model": "fake",
                "messages": [{"role": "user", "content": "x"}],
                "add_special_tokens": True,
            },
            "add_special_tokens",
        ),
        ("/detokenize", {"model": "fake", "tokens": [65, 256]}, "tokens"),
        ("/detokenize", {"model": "fake", "tokens": ["a"]}, "tokens.0"),
    ],
)
def test_bad_tokenize_requests_are_400(admin, client, path, body, param):
    refused = admin.post(path, json=body)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text


def test_tokenize_is_authenticated_and_per_tenant(platform, admin, client):
    anonymous = httpx.post(platform.base_url + "/tokenize", json={"model": "fake", "prompt": "x"})
    assert anonymous.status_code == 401
    quota = {"max_deployments": 1, "max_replicas": 1, "max_gpus": 1, "allowed_sources": ["fake://"]}
    assert admin.put("/v1/tenants/tok-owner/quota", json=quota).status_code == 200
    owner = tenant_client(platform, new_key(admin, "tok-owner"))
    other = tenant_client(platform, new_key(admin, "tok-other"))
    created = owner.post(
        "/v1/deployments", json={"name": "tok-owner-private", "source": "fake://p"}
    )
    assert created.status_code == 201, created.text
    body = {"model": "tok-owner-private", "prompt": "x"}
    assert owner.post("/tokenize", json=body).status_code == 200
    for path, request in (
        ("/tokenize", body),
        ("/detokenize", {"model": "tok-owner-private", "tokens": [1]}),
    ):
        refused = other.post(path, json=request)
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"


# --- openai-agents ------------------------------------------------------------------------


def test_an_agent_with_a_function_tool_on_its_default_model(platform, client):
    """openai-agents' default model class speaks the Responses API: the agent calls the
    tool and sends the call and its result back as items for the model's next turn."""
    from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
    from agents.exceptions import ModelBehaviorError
    from agents.models.openai_provider import OpenAIProvider

    calls = []

    @function_tool
    def get_weather(answer: str) -> str:
        """The weather in a city."""
        calls.append(answer)
        return "sunny"

    api = openai.AsyncOpenAI(
        base_url=platform.base_url + "/v1", api_key=platform.admin_key, max_retries=0
    )
    config = RunConfig(model_provider=OpenAIProvider(openai_client=api), tracing_disabled=True)
    agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model="fake")
    stopped = agent.clone(tool_use_behavior="stop_on_first_tool")
    result = Runner.run_sync(stopped, QUESTION, run_config=config, max_turns=3)
    assert calls == ["Paris"] and result.final_output == "sunny"

    # Past the tool, the fake model only ever stops at the length limit (120 tokens: room
    # for the call, not for the words after it): the second turn
    # (function_call and function_call_output items in) is answered, cut off, which the
    # agent takes for the failure an incomplete response is to it.
    short = agent.clone(model_settings=ModelSettings(max_tokens=120))
    with pytest.raises(ModelBehaviorError, match="max_output_tokens"):
        Runner.run_sync(short, QUESTION, run_config=config, max_turns=3)
    assert calls == ["Paris", "Paris"]


def test_item_references_to_earlier_output_as_the_ai_sdk_sends_them(client, tenant_clients):
    """With store on, the AI SDK sends earlier assistant text as an item_reference."""
    first = client.responses.create(model="fake", input=QUESTION, max_output_tokens=8)
    (message,) = first.output
    history = [
        {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
        {"type": "item_reference", "id": message.id},
        {"role": "user", "content": [{"type": "input_text", "text": "And Spain?"}]},
    ]
    second = client.responses.create(model="fake", input=history, max_output_tokens=4)
    assert second.usage.input_tokens > first.usage.input_tokens + len("And Spain?")
    items = client.responses.input_items.list(second.id, order="asc").data
    assert items[1].id == message.id and items[1].content[0].text == FAKE_REPLY[:8]
    # Another tenant cannot reach the item by naming it.
    with pytest.raises(openai.NotFoundError) as info:
        tenant_clients[0].responses.create(model="fake", input=history, max_output_tokens=4)
    assert info.value.body["param"] == "input.1.id"


def test_a_run_that_fails_ends_the_stream_with_response_failed(platform, admin, client):
    deploy(admin, "refuses", source="fake://r?error_pct=100", idle_timeout_s=60)
    stream = client.responses.create(model="refuses", input=QUESTION, stream=True)
    events = list(stream)
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.message
    assert [e.sequence_number for e in events] == list(range(len(events)))
    with pytest.raises(openai.APIStatusError):
        client.responses.create(model="refuses", input=QUESTION)
