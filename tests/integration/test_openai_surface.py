"""The OpenAI surface beyond plain chat on the fake engine, through the official client:
vLLM's sampling extras, model facts, tool calling."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
from support import Platform, deploy, deployment, temp_home, wait_until

from ebb.queue import keys
from ebb.testing.fake_model import FAKE_REPLY

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform():
    # The local webhook receiver; interrupted batches resumed within the tests' patience.
    env = {"EBB_WEBHOOK_ALLOWED_CIDRS": "127.0.0.0/8", "EBB_BATCH_RESUME_AFTER_S": "1"}
    p = Platform(home=temp_home("ebb-it-oai-"), redis_url=None, env_extra=env).start()
    yield p
    assert p.stop() == 0


@pytest.fixture(scope="module")
def client(platform, admin):
    deploy(admin, "fake", source="fake://m?ctx=4096", idle_timeout_s=60)
    return platform.openai()


def test_stop_token_ids_end_the_completion(client):
    reply = client.chat.completions.create(
        model="fake", messages=MESSAGES, max_tokens=40, extra_body={"stop_token_ids": [ord("P")]}
    )
    assert reply.choices[0].message.content == FAKE_REPLY[: FAKE_REPLY.index("P")]
    assert reply.choices[0].finish_reason == "stop"


def test_min_tokens_holds_stop_conditions_back(client):
    reply = client.completions.create(
        model="fake",
        prompt="x",
        max_tokens=40,
        extra_body={"stop_token_ids": [ord("P")], "min_tokens": 30, "top_k": 5, "min_p": 0.1},
    )
    assert reply.usage.completion_tokens == 40
    assert reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"top_k": -7}, "top_k"),
        ({"repetition_penalty": -1}, "repetition_penalty"),
        ({"logit_bias": {"9999": 1}}, "logit_bias"),
        ({"logit_bias": {"12": 500}}, "logit_bias.12"),
        ({"min_tokens": 50, "max_tokens": 10}, "min_tokens"),
        ({"length_penalty": 2.0}, "length_penalty"),
        ({"top_kay": 1}, "top_kay"),
    ],
)
def test_bad_extras_are_400_naming_the_parameter(client, platform_redis, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fake", messages=MESSAGES, extra_body=extra)
    error = info.value.body
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param.split(".")[0] in error["message"]
    assert platform_redis.zcard(keys.queue("fake")) == 0


# --- models -----------------------------------------------------------------------------


def test_model_retrieve_and_facts(client, admin):
    model = client.models.retrieve("fake")
    assert model.id == "fake" and model.object == "model" and model.owned_by == "ebb"
    card = admin.get("/v1/models/fake").json()
    assert card["max_model_len"] == 4096
    assert card["capabilities"] == {
        "chat_completions": True,
        "completions": True,
        "embeddings": False,
        "tools": True,
        "tool_choice_auto": True,
    }
    listed = {m["id"]: m for m in admin.get("/v1/models").json()["data"]}
    assert listed["fake"] == card


def test_unknown_model_is_openai_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.body["code"] == "model_not_found"
    assert info.value.body["param"] == "model" and "no-such-model" in info.value.body["message"]


# --- tools ------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}},
    },
}
FORCED = {"type": "function", "function": {"name": "get_weather"}}


def test_auto_tool_call_whole_and_streamed(client):
    reply = client.chat.completions.create(model="fake", messages=MESSAGES, tools=[WEATHER])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"answer": "Paris"}

    stream = client.chat.completions.create(
        model="fake", messages=MESSAGES, tools=[WEATHER], stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    assert json.loads(_streamed_arguments(chunks)) == {"answer": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("choice", ["required", FORCED])
def test_forced_tool_calls(client, choice):
    kwargs = {"model": "fake", "messages": MESSAGES, "tools": [WEATHER], "tool_choice": choice}
    reply = client.chat.completions.create(**kwargs)
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"answer": "Paris"}
    assert reply.choices[0].finish_reason == ("tool_calls" if choice == "required" else "stop")
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    assert json.loads(_streamed_arguments(chunks)) == {"answer": "Paris"}


def test_a_required_call_cut_off_by_max_tokens_is_a_tool_call(client):
    kwargs = {"model": "fake", "messages": MESSAGES, "tools": [WEATHER], "max_tokens": 30}
    reply = client.chat.completions.create(**kwargs, tool_choice="required")
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    chunks = list(client.chat.completions.create(**kwargs, tool_choice="required", stream=True))
    assert _streamed_arguments(chunks) == call.function.arguments
    # Cut off inside the name: no call to show, and never the guided JSON as text.
    kwargs["max_tokens"] = 12
    reply = client.chat.completions.create(**kwargs, tool_choice="required")
    assert not reply.choices[0].message.content and not reply.choices[0].message.tool_calls
    chunks = list(client.chat.completions.create(**kwargs, tool_choice="required", stream=True))
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_fields_real_clients_send_are_accepted(client, platform):
    """guidellm's continuous usage, OpenAI's documented fields with no meaning here, and
    vLLM's health path: no 400, no 404."""
    stream = client.chat.completions.create(
        model="fake",
        messages=MESSAGES,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "prompt_cache_key": "conversation-1",
            "safety_identifier": "user-1",
            "verbosity": "low",
        },
    )
    chunks = list(stream)
    with_text = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert with_text and all(c.usage is not None for c in with_text)
    counts = [c.usage.completion_tokens for c in with_text]
    assert counts == sorted(counts) and chunks[-1].usage.completion_tokens == 5
    assert httpx.get(platform.base_url + "/health").status_code == 200


def test_tool_result_turn(client):
    first = client.chat.completions.create(model="fake", messages=MESSAGES, tools=[WEATHER])
    message = first.choices[0].message
    conversation = [
        *MESSAGES,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "sunny, 21 C"},
    ]
    reply = client.chat.completions.create(
        model="fake", messages=conversation, tools=[WEATHER], max_tokens=12
    )
    assert reply.choices[0].message.content == FAKE_REPLY[:12]
    assert reply.choices[0].message.tool_calls is None


def test_tool_call_through_a_job(admin):
    body = {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": "required"}
    response = admin.post(
        "/v1/jobs", json={"model": "fake", "endpoint": "chat.completions", "body": body}
    )
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]

    def done():
        job = admin.get(f"/v1/jobs/{job_id}").json()
        return job if job["status"] == "succeeded" else None

    job = wait_until(done, 60, "the job to succeed")
    (call,) = job["result"]["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"answer": "Paris"}


def _streamed_arguments(chunks) -> str:
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert calls and calls[0].id and calls[0].function.name == "get_weather"
    assert all(tc.index == 0 for tc in calls)
    return "".join(tc.function.arguments or "" for tc in calls)


# --- embeddings -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedder(admin):
    deploy(admin, "fake-embed", source="fake://m?ctx=64", serving={"task": "embed"})
    return "fake-embed"


def test_embeddings_float_and_base64(client, embedder, platform_redis):
    reply = client.embeddings.create(
        model=embedder, input=["Paris", "Paris", "Rome"], encoding_format="float"
    )
    vectors = [d.embedding for d in reply.data]
    assert [d.index for d in reply.data] == [0, 1, 2]
    assert vectors[0] == vectors[1] and vectors[0] != vectors[2]
    assert len(vectors[0]) == 8
    assert reply.usage.prompt_tokens == len("ParisParisRome") == reply.usage.total_tokens
    # The SDK asks for base64 by default and decodes it: the same vectors come back.
    decoded = client.embeddings.create(model=embedder, input=["Paris", "Rome"])
    assert decoded.data[0].embedding == pytest.approx(vectors[0], rel=1e-6)
    assert decoded.data[1].embedding == pytest.approx(vectors[2], rel=1e-6)
    tokens = client.embeddings.create(model=embedder, input=[80, 97], dimensions=4)
    assert len(tokens.data[0].embedding) == 4 and tokens.usage.prompt_tokens == 2


def test_embeddings_are_billed_as_prompt_tokens(admin, embedder):
    before = _usage(admin, embedder)
    response = admin.post("/v1/embeddings", json={"model": embedder, "input": "abc"})
    assert response.status_code == 200, response.text
    wait_until(lambda: _usage(admin, embedder)["requests"] > before["requests"], 30, "usage")
    after = _usage(admin, embedder)
    assert after["requests"] == before["requests"] + 1
    assert after["prompt_tokens"] == before["prompt_tokens"] + 3
    assert after["completion_tokens"] == before["completion_tokens"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "fake", "input": "x"}, "model"),  # a generative deployment
        ({"model": "fake-embed", "input": ""}, "input.0"),
        ({"model": "fake-embed", "input": []}, "input"),
        ({"model": "fake-embed", "input": "x" * 65}, "input.0"),
        ({"model": "fake-embed", "input": [[300]]}, "input.0"),
        ({"model": "fake-embed", "input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"model": "fake-embed", "input": "x", "dimensions": 0}, "dimensions"),
        ({"model": "fake-embed", "input": "x", "extra": 1}, "extra"),
    ],
)
def test_bad_embedding_requests(admin, embedder, body, param):
    response = admin.post("/v1/embeddings", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def _settled_job(admin, job_id: str) -> dict:
    def done():
        job = admin.get(f"/v1/jobs/{job_id}").json()
        return job if job["status"] in ("succeeded", "failed", "cancelled", "expired") else None

    return wait_until(done, 60, f"job {job_id} to settle")


def test_embeddings_through_a_job_match_the_synchronous_ones(client, admin, embedder):
    from openai.types import CreateEmbeddingResponse

    sync = client.embeddings.create(
        model=embedder, input=["Paris", "Rome"], encoding_format="float"
    )
    before = _usage(admin, embedder)
    body = {"input": ["Paris", "Rome", "Paris"], "encoding_format": "float"}
    response = admin.post(
        "/v1/jobs", json={"model": embedder, "endpoint": "embeddings", "body": body}
    )
    assert response.status_code == 202, response.text
    job = _settled_job(admin, response.json()["id"])
    assert job["status"] == "succeeded" and job["endpoint"] == "embeddings"
    result = CreateEmbeddingResponse.model_validate(job["result"])
    vectors = [d.embedding for d in result.data]
    assert [d.index for d in result.data] == [0, 1, 2]
    assert vectors == [sync.data[0].embedding, sync.data[1].embedding, sync.data[0].embedding]
    assert result.usage.prompt_tokens == len("ParisRomeParis") == result.usage.total_tokens
    # Billed once, as prompt tokens only.
    wait_until(lambda: _usage(admin, embedder)["requests"] > before["requests"], 30, "usage")
    after = _usage(admin, embedder)
    assert after["requests"] == before["requests"] + 1
    assert after["prompt_tokens"] - before["prompt_tokens"] == len("ParisRomeParis")
    assert after["completion_tokens"] == before["completion_tokens"]
    # base64, as the SDK decodes it.
    response = admin.post(
        "/v1/jobs",
        json={
            "model": embedder,
            "endpoint": "embeddings",
            "body": {"input": "Rome", "encoding_format": "base64"},
        },
    )
    job = _settled_job(admin, response.json()["id"])
    import base64
    import struct

    raw = base64.b64decode(job["result"]["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(vectors[1], rel=1e-6)


@pytest.mark.parametrize(
    ("model", "body", "param"),
    [
        ("fake", {"input": "x"}, "model"),  # a generative deployment
        ("fake-embed", {"input": ""}, "body.input.0"),
        ("fake-embed", {"input": "x", "stream": True}, "body.stream"),
        ("fake-embed", {"input": "x", "dimensions": 0}, "body.dimensions"),
    ],
)
def test_bad_embedding_jobs(admin, embedder, model, body, param):
    response = admin.post("/v1/jobs", json={"model": model, "endpoint": "embeddings", "body": body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_an_embeddings_batch(client, embedder):
    lines = [
        {
            "custom_id": "one",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": embedder, "input": "Paris", "encoding_format": "float"},
        },
        {
            "custom_id": "two",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": embedder, "input": ["Paris", "Rome"], "encoding_format": "float"},
        },
        {
            "custom_id": "bad",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": embedder, "input": ""},
        },
    ]
    uploaded = client.files.create(file=("e.jsonl", _batch_file(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    done = _settled_batch(client, batch.id)
    assert done.status == "completed" and done.endpoint == "/v1/embeddings"
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    by_id = {o["custom_id"]: o["response"]["body"] for o in output}
    assert by_id["one"]["object"] == "list" and len(by_id["two"]["data"]) == 2
    assert by_id["one"]["data"][0]["embedding"] == by_id["two"]["data"][0]["embedding"]
    assert by_id["two"]["usage"] == {"prompt_tokens": len("ParisRome"), "total_tokens": 9}
    (error,) = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert error["custom_id"] == "bad" and "empty" in error["error"]["message"]


def test_chat_to_an_embedding_deployment_is_refused(client, embedder):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=embedder, messages=MESSAGES)
    assert info.value.body["param"] == "model" and "embeddings" in info.value.body["message"]
    card = client.models.retrieve(embedder).model_dump()
    assert card["capabilities"]["embeddings"] and not card["capabilities"]["completions"]


def test_a_full_embeddings_queue_refuses_at_once(platform, admin):
    source = "fake://m?ctx=64&load_s=3"
    deploy(admin, "embed-tiny", source=source, serving={"task": "embed"}, queue_depth_limit=1)
    first: dict = {}

    def call():
        first["reply"] = platform.openai().embeddings.create(model="embed-tiny", input="Paris")

    thread = threading.Thread(target=call)
    thread.start()
    wait_until(lambda: deployment(admin, "embed-tiny")["queue_depth"] == 1, 10, "the first")
    with pytest.raises(openai.APIStatusError) as refused:
        platform.openai().embeddings.create(model="embed-tiny", input="Rome")
    assert refused.value.status_code == 503
    assert refused.value.body["code"] == "queue_full"
    assert "retry-after" in refused.value.response.headers
    thread.join(timeout=60)
    assert len(first["reply"].data) == 1


def _usage(admin, deployment: str) -> dict:
    rows = admin.get("/v1/usage").json()["data"]
    mine = [r for r in rows if r["deployment"] == deployment]
    keys = ("requests", "prompt_tokens", "completion_tokens")
    return {k: sum(r[k] for r in mine) for k in keys}


# --- the Batch API ----------------------------------------------------------------------


def _batch_file(lines: list[dict]) -> bytes:
    return "\n".join(json.dumps(line) for line in lines).encode() + b"\n"


def _chat_line(custom_id: str, model: str = "fake", **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": MESSAGES, "max_tokens": 5, **body},
    }


def _settled_batch(client, batch_id: str, timeout_s: float = 60):
    def look():
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status in ("completed", "expired", "cancelled", "failed") else None

    return wait_until(look, timeout_s, f"batch {batch_id} to settle")


def test_batch_through_the_sdk_with_a_refused_line(client, admin):
    deploy(
        admin,
        "fake-batch",
        source="fake://m?ctx=4096",
        price_per_1m_output_tokens_micros=10**9,
        serving={"batch_discount_pct": 50},
    )
    lines = [
        _chat_line("a", "fake-batch"),
        _chat_line("b", "fake-batch", max_tokens=7),
        _chat_line("bad", "fake-batch", temperature=9),
    ]
    uploaded = client.files.create(file=("in.jsonl", _batch_file(lines)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes > 0
    assert client.files.content(uploaded.id).content == _batch_file(lines)
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "7"},
    )
    # Answered at once; its lines are validated and queued in the background (issue 46).
    assert batch.status == "validating" and batch.request_counts.total == 0
    done = _settled_batch(client, batch.id)
    assert done.status == "completed" and done.metadata == {"run": "7"}
    assert done.request_counts.total == 3
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    by_id = {o["custom_id"]: o for o in output}
    assert set(by_id) == {"a", "b"}
    assert by_id["a"]["response"]["status_code"] == 200
    assert by_id["a"]["response"]["body"]["choices"][0]["message"]["content"] == FAKE_REPLY[:5]
    assert by_id["b"]["response"]["body"]["usage"]["completion_tokens"] == 7
    (error,) = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert error["custom_id"] == "bad" and error["response"] is None
    assert "temperature" in error["error"]["message"]
    assert done.id in [b.id for b in client.batches.list().data]
    # Billed at half the output price: 12 tokens at 1000.00 per 1M (1000 micros each), less 50 %.
    wait_until(lambda: _usage(admin, "fake-batch")["requests"] == 2, 30, "usage recorded")
    cost = sum(
        r["token_cost_micros"]
        for r in admin.get("/v1/usage").json()["data"]
        if r["deployment"] == "fake-batch"
    )
    assert cost == 12 * 1000 // 2


def test_batch_cancel_runs_nothing_more(client, admin):
    deploy(admin, "fake-slow", source="fake://m?ctx=4096&step_ms=100", max_concurrency=1)
    lines = [_chat_line(f"r{i}", "fake-slow", max_tokens=50) for i in range(4)]
    uploaded = client.files.create(file=("slow.jsonl", _batch_file(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = _settled_batch(client, batch.id)
    assert done.status == "cancelled"
    assert done.request_counts.completed < 4
    errors = client.files.content(done.error_file_id).text.splitlines()
    assert len(errors) == 4 - done.request_counts.completed


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([{"custom_id": "a", "method": "GET", "url": "/v1/chat/completions", "body": {}}], "POST"),
        ([_chat_line("a"), _chat_line("a")], "used twice"),
        ([{**_chat_line("a"), "url": "/v1/completions"}], "batch's endpoint"),
    ],
)
def test_bad_batch_files_fail_the_batch(client, lines, message):
    # Validated in the background (issue 46): the batch fails with OpenAI's `errors`.
    uploaded = client.files.create(file=("x.jsonl", _batch_file(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = _settled_batch(client, batch.id)
    assert done.status == "failed" and done.errors is not None
    [error] = done.errors.data
    assert message in error.message
    assert error.param == "input_file_id" and error.line is not None


def test_files_are_the_uploaders(platform, client, admin):
    uploaded = client.files.create(
        file=("x.jsonl", _batch_file([_chat_line("a")])), purpose="batch"
    )
    key = admin.post("/v1/keys", json={"tenant": "other"}).json()["key"]
    stranger = platform.openai(api_key=key)
    with pytest.raises(openai.NotFoundError):
        stranger.files.content(uploaded.id)
    with pytest.raises(openai.BadRequestError) as info:
        client.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")
    assert info.value.body["param"] == "purpose"


def test_batches_cli(platform, admin, tmp_path):
    deploy(admin, "fake-cli", source="fake://m?ctx=4096")
    path = tmp_path / "in.jsonl"
    path.write_bytes(_batch_file([_chat_line("x", "fake-cli"), _chat_line("y", "fake-cli")]))
    created = platform.cli("batches", "create", str(path), "--wait", "--json")
    assert created.returncode == 0, created.stderr
    batch = json.loads(created.stdout)
    assert batch["status"] == "completed" and batch["request_counts"]["completed"] == 2
    listed = platform.cli("batches", "--json")
    assert batch["id"] in [b["id"] for b in json.loads(listed.stdout)["data"]]
    output = platform.cli("batches", "output", batch["id"])
    assert sorted(json.loads(x)["custom_id"] for x in output.stdout.splitlines()) == ["x", "y"]
    no_errors = platform.cli("batches", "output", batch["id"], "--errors")
    assert no_errors.returncode == 1 and "no error file" in no_errors.stderr
    missing = platform.cli("batches", "show", "batch_nope")
    assert missing.returncode == 1 and "No batch" in missing.stderr


def test_batch_completed_webhook_without_polling(client, admin, receiver):
    from standardwebhooks import Webhook

    deploy(admin, "fake-hook", source="fake://m?ctx=4096")
    secret = admin.get("/v1/webhooks/secret").json()["secret"]
    content = _batch_file([_chat_line("only", "fake-hook")])
    uploaded = client.files.create(file=("hook.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"webhook": {"url": receiver.url}},
    )
    (delivery,) = wait_until(
        lambda: receiver.accepted(batch.id, "batch.completed"), 60, "batch.completed"
    )
    event = Webhook(secret).verify(delivery.body, delivery.headers)
    assert event["data"]["status"] == "completed" and event["data"]["output_file_id"]
    assert event["data"]["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert client.batches.retrieve(batch.id).status == "completed"
    assert len(receiver.accepted(batch.id, "batch.completed")) == 1


def test_an_interrupted_batch_is_resumed_and_runs_nothing_twice(client, admin, platform_redis):
    import msgspec

    from ebb.queue.batch_store import BatchRecord, BatchStatus

    deploy(admin, "fake-resume", source="fake://m?ctx=4096")
    lines = [_chat_line("p", "fake-resume"), _chat_line("q", "fake-resume")]
    uploaded = client.files.create(file=("r.jsonl", _batch_file(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    first = _settled_batch(client, batch.id)
    ran = sorted(
        json.loads(x)["response"]["request_id"]
        for x in client.files.content(first.output_file_id).text.splitlines()
    )
    # As if the frontdoor had died after queueing the lines, before recording them.
    record = msgspec.json.decode(platform_redis.get(keys.batch(batch.id)), type=BatchRecord)
    record.status, record.lines, record.output_file_id = BatchStatus.VALIDATING, [], None
    record.completed_at_s = None
    platform_redis.set(keys.batch(batch.id), msgspec.json.encode(record))
    platform_redis.sadd(keys.BATCHES_ACTIVE, batch.id)
    resumed = wait_until(
        lambda: (b := client.batches.retrieve(batch.id)).status == "completed" and b,
        60,
        "the watcher to resume the batch",
    )
    again = sorted(
        json.loads(x)["response"]["request_id"]
        for x in client.files.content(resumed.output_file_id).text.splitlines()
    )
    assert again == ran, "resuming queued the same jobs again instead of new ones"
    jobs = admin.get("/v1/jobs", params={"limit": 100}).json()["data"]
    assert sum(1 for j in jobs if j["metadata"].get("batch_id") == batch.id) == 2
