"""The OpenAI surface beyond plain chat on the real vLLM engine and the default model,
through the official `openai` client: vLLM's sampling extras, model facts, tool calls, the
Responses API; and the clients that speak the Responses API by default (openai-agents, the
Vercel AI SDK's `openai(model)`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
from support import real_engine_platform, wait_until

from ebb.config import DEFAULT_MODEL_NAME

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
SCHEMA = WEATHER["function"]["parameters"]
FORCED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def platform(default_local_model):
    # A long admission window: the first request waits out a cold start on a busy CPU.
    with real_engine_platform(
        "ebb-e2e-oai-", default_model=True, EBB_PREWARM="1", EBB_ADMISSION_TIMEOUT_S="240"
    ) as p:
        yield p


@pytest.fixture(scope="module")
def client(platform):
    return platform.openai(timeout=300)


def test_min_tokens_equal_to_max_tokens_gives_exactly_that_many(client):
    for _ in range(2):  # chat, then completions
        reply = client.chat.completions.create(
            model=DEFAULT_MODEL_NAME,
            messages=[{"role": "user", "content": "Say OK."}],
            max_tokens=10,
            temperature=0,
            extra_body={"min_tokens": 10, "top_k": 20, "repetition_penalty": 1.1},
        )
        assert reply.usage.completion_tokens == 10
    reply = client.completions.create(
        model=DEFAULT_MODEL_NAME,
        prompt="Paris.",
        max_tokens=10,
        extra_body={"min_tokens": 10, "stop_token_ids": [2], "min_p": 0.05},
    )
    assert reply.usage.completion_tokens == 10


def test_logit_bias_forces_a_token(client, default_local_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_local_model.path)
    (token_id,) = tokenizer.encode(" banana", add_special_tokens=False)[:1]
    reply = client.completions.create(
        model=DEFAULT_MODEL_NAME,
        prompt="The capital of France is",
        max_tokens=3,
        temperature=0,
        logit_bias={str(token_id): 100},
    )
    assert reply.choices[0].text == tokenizer.decode([token_id] * 3)


def test_model_facts(client, admin):
    model = client.models.retrieve(DEFAULT_MODEL_NAME)
    assert model.id == DEFAULT_MODEL_NAME
    card = admin.get(f"/v1/models/{DEFAULT_MODEL_NAME}").json()
    assert card["max_model_len"] > 0
    assert card["capabilities"]["chat_completions"] and card["capabilities"]["tools"]


@pytest.mark.parametrize("choice", [FORCED, "required"])
def test_forced_tool_call_matches_the_schema(client, choice):
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice=choice,
        temperature=0,
        max_tokens=100,
    )
    calls = reply.choices[0].message.tool_calls
    assert calls, "a forced choice must call"
    for call in calls:  # "required" may call more than once: parallel calls are allowed
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    assert reply.choices[0].finish_reason == ("tool_calls" if choice == "required" else "stop")


@pytest.mark.parametrize("choice", [FORCED, "required"])
def test_forced_tool_call_streamed_assembles_into_valid_json(client, choice):
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice=choice,
        temperature=0,
        max_tokens=100,
        stream=True,
    )
    deltas = [tc for c in stream if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assembled: dict[int, str] = {}
    for delta in deltas:
        if delta.index not in assembled:  # a call's first delta names it
            assert delta.id and delta.function.name == "get_weather"
        assembled[delta.index] = assembled.get(delta.index, "") + (delta.function.arguments or "")
    assert sorted(assembled) == list(range(len(assembled))) and assembled
    for arguments in assembled.values():
        jsonschema.validate(json.loads(arguments), SCHEMA)


def test_tool_result_turn(client):
    first = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice=FORCED,
        temperature=0,
        max_tokens=100,
    )
    message = first.choices[0].message
    result = "Sunny, 21 degrees celsius."
    conversation = [
        *QUESTION,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": result},
    ]
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=conversation,
        tools=[WEATHER],
        tool_choice="none",
        temperature=0,
        max_tokens=32,
    )
    choice = reply.choices[0]
    assert choice.message.content and choice.message.tool_calls is None
    # The call and its result are part of the prompt the model answered.
    alone = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME, messages=QUESTION, max_tokens=1
    )
    assert reply.usage.prompt_tokens > alone.usage.prompt_tokens + len(result.split())


def test_embeddings_from_a_pooling_deployment_of_the_default_weights(client, admin):
    from ebb.config import DEFAULT_MODEL_SOURCE

    created = admin.post(
        "/v1/deployments",
        json={
            "name": "smol-embed",
            "source": DEFAULT_MODEL_SOURCE,
            "idle_timeout_s": 30,
            "serving": {"task": "embed"},
        },
    )
    assert created.status_code == 201, created.text
    texts = ["The capital of France is Paris.", "The capital of France is Paris.", "Bananas."]
    reply = client.embeddings.create(model="smol-embed", input=texts)  # base64, decoded
    vectors = [d.embedding for d in reply.data]
    assert vectors[0] == pytest.approx(vectors[1], abs=1e-6)
    assert vectors[0] != pytest.approx(vectors[2], abs=1e-3)
    assert len(vectors[0]) == 576  # SmolLM2-135M's hidden size
    assert sum(x * x for x in vectors[0]) == pytest.approx(1.0, rel=1e-3)  # normalized
    assert reply.usage.prompt_tokens > 0
    floats = client.embeddings.create(model="smol-embed", input=texts[0], encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(vectors[0], abs=1e-6)


def test_embeddings_through_a_batch_match_the_synchronous_ones(client):
    # The pooling deployment of the previous test; a batch line may embed several inputs.
    texts = ["The capital of France is Paris.", "Bananas."]
    sync = client.embeddings.create(model="smol-embed", input=texts, encoding_format="float")
    lines = [
        {
            "custom_id": "both",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "smol-embed", "input": texts, "encoding_format": "float"},
        },
        {
            "custom_id": "one",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "smol-embed", "input": texts[1], "encoding_format": "base64"},
        },
    ]
    content = "\n".join(json.dumps(line) for line in lines).encode()
    uploaded = client.files.create(file=("embed.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )

    def settled():
        current = client.batches.retrieve(batch.id)
        return current if current.status not in ("validating", "in_progress") else None

    done = wait_until(settled, 300, "the embeddings batch to complete")
    assert done.status == "completed" and done.request_counts.completed == 2
    output = {
        o["custom_id"]: o["response"]["body"]
        for o in map(json.loads, client.files.content(done.output_file_id).text.splitlines())
    }
    both = [d["embedding"] for d in output["both"]["data"]]
    assert both[0] == pytest.approx(sync.data[0].embedding, abs=1e-5)
    assert both[1] == pytest.approx(sync.data[1].embedding, abs=1e-5)
    assert output["both"]["usage"]["prompt_tokens"] == sync.usage.prompt_tokens
    # base64 as OpenAI writes it: little-endian float32.
    import base64
    import struct

    raw = base64.b64decode(output["one"]["data"][0]["embedding"])
    one = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert list(one) == pytest.approx(sync.data[1].embedding, abs=1e-5)


def test_a_three_line_batch_to_completion(client):
    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": DEFAULT_MODEL_NAME,
                "messages": [{"role": "user", "content": question}],
                "temperature": 0,
                "max_tokens": 16,
            },
        }
        for i, question in enumerate(["Capital of France?", "Capital of Italy?", "2 + 2 ="])
    ]
    content = "\n".join(json.dumps(line) for line in lines).encode()
    uploaded = client.files.create(file=("three.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )

    def settled():
        current = client.batches.retrieve(batch.id)
        return current if current.status not in ("validating", "in_progress") else None

    done = wait_until(settled, 300, "the batch to complete")
    assert done.status == "completed" and done.request_counts.completed == 3
    assert done.error_file_id is None
    output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in output) == ["q0", "q1", "q2"]
    for item in output:
        body = item["response"]["body"]
        assert item["response"]["status_code"] == 200 and body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"] and body["usage"]["completion_tokens"] > 0


# --- the Responses API and the clients that speak it by default --------------------------

FRANCE = "What is the capital of France?"
RESPONSES_WEATHER = {"type": "function", **WEATHER["function"], "strict": True}


def test_responses_answer_paris(client):
    reply = client.responses.create(
        model=DEFAULT_MODEL_NAME, input=FRANCE, temperature=0, max_output_tokens=32
    )
    assert reply.status == "completed" and "Paris" in reply.output_text
    assert reply.usage.output_tokens > 0 and reply.usage.input_tokens > 0


def test_responses_streamed_with_its_event_types(client):
    with client.responses.stream(
        model=DEFAULT_MODEL_NAME, input=FRANCE, temperature=0, max_output_tokens=32
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == final.output_text
    assert "Paris" in final.output_text


def test_responses_function_tool_round_trip_by_previous_response_id(client):
    first = client.responses.create(
        model=DEFAULT_MODEL_NAME,
        input="What is the weather in Paris?",
        tools=[RESPONSES_WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=100,
    )
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), SCHEMA)
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C."}
    second = client.responses.create(
        model=DEFAULT_MODEL_NAME,
        previous_response_id=first.id,
        input=[output],
        tools=[RESPONSES_WEATHER],
        tool_choice="none",
        temperature=0,
        max_output_tokens=48,
    )
    assert second.previous_response_id == first.id
    assert [item.type for item in second.output] == ["message"] and second.output_text
    # The question, the call and its output all went into the second prompt (which renders
    # no tools: tool_choice is "none").
    alone = client.responses.create(
        model=DEFAULT_MODEL_NAME, input="What is the weather in Paris?", max_output_tokens=16
    )
    assert second.usage.input_tokens > alone.usage.input_tokens + len(output["output"].split())


def test_an_openai_agents_agent_on_its_default_model(platform):
    """openai-agents' default model (OpenAIResponsesModel) drives the real engine: a plain
    answer, and a forced function tool whose result ends the run."""
    import openai
    from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
    from agents.models.openai_provider import OpenAIProvider

    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        calls.append(city)
        return "Sunny, 21 C."

    api = openai.AsyncOpenAI(
        base_url=platform.base_url + "/v1", api_key=platform.admin_key, timeout=300
    )
    config = RunConfig(model_provider=OpenAIProvider(openai_client=api), tracing_disabled=True)
    settings = ModelSettings(temperature=0, max_tokens=64)
    plain = Agent(name="geo", model=DEFAULT_MODEL_NAME, model_settings=settings)
    assert "Paris" in Runner.run_sync(plain, FRANCE, run_config=config, max_turns=1).final_output

    forced = ModelSettings(temperature=0, max_tokens=100, tool_choice="get_weather")
    weather = plain.clone(
        tools=[get_weather], model_settings=forced, tool_use_behavior="stop_on_first_tool"
    )
    result = Runner.run_sync(weather, "What is the weather in Paris?", run_config=config)
    assert calls == ["Paris"] and result.final_output == "Sunny, 21 C."


AI_SDK = Path(__file__).parent / "ai_sdk"


@pytest.fixture(scope="module")
def ai_sdk(platform):
    """Runs tests/e2e/ai_sdk/client.mjs (the Vercel AI SDK's default `openai(model)`
    provider) against the platform; installs its locked packages with `npm ci` first."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("the AI SDK check needs node and npm on PATH")
    lock = AI_SDK / "package-lock.json"
    installed = AI_SDK / "node_modules" / ".package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--prefer-offline"],
            cwd=AI_SDK,
            check=True,
            timeout=300,
        )
    env = {
        **os.environ,
        "EBB_BASE_URL": platform.base_url + "/v1",
        "EBB_API_KEY": platform.admin_key,
        "EBB_MODEL": DEFAULT_MODEL_NAME,
    }

    def run(kind: str) -> dict:
        done = subprocess.run(
            ["node", "client.mjs", kind], cwd=AI_SDK, env=env, capture_output=True, timeout=300
        )
        assert done.returncode == 0, (done.stdout, done.stderr)
        return json.loads(done.stdout)

    return run


def test_the_ai_sdk_default_provider_answers_streams_and_calls_a_tool(ai_sdk):
    text = ai_sdk("text")
    assert "Paris" in text["text"] and text["finishReason"] == "stop"
    assert text["usage"]["outputTokens"] > 0
    streamed = ai_sdk("stream")
    assert "Paris" in streamed["text"] and streamed["parts"] > 1
    tool = ai_sdk("tool")
    # Step one called the tool, step two answered after its result.
    assert tool["calls"] == ["Paris"] and tool["steps"] == 2 and tool["text"]
