"""Continuation by token replay against `ebb up` (fake engine): a runner SIGKILLed in the
middle of an answer, and the answer goes on on another runner, the client none the wiser
beyond a pause: nothing repeated or missing, greedy text equal to an uninterrupted run's,
logprobs for every token, one usage (prompt once, completion = every token delivered)."""

from __future__ import annotations

import json
import os
import signal
import threading

import httpx
import pytest
from support import Platform, deploy, deployment, temp_home, wait_until
from support.billing import raw_usage

from ebb.queue import keys

pytestmark = pytest.mark.integration

MODEL = "cont"
TOKENS = 150
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform():
    p = Platform(home=temp_home("ebb-cont-"), redis_url=None).start()
    yield p
    assert p.stop() == 0


@pytest.fixture(scope="module")
def served(admin):
    # Two warm runners: the one that loses a request and the one that continues it.
    deploy(admin, MODEL, "fake://c?step_ms=20", min_replicas=2, max_replicas=2)
    wait_until(lambda: len(_ready(admin)) == 2, 60, "two runners to be ready")
    return MODEL


def _ready(admin: httpx.Client) -> list[dict]:
    return [r for r in deployment(admin, MODEL)["runners"] if r["state"] == "ready"]


def _body(stream: bool) -> dict:
    return {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": TOKENS,
        "temperature": 0,
        "logprobs": True,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }


def _kill_holder(platform: Platform, admin: httpx.Client, request_id: str) -> str:
    """SIGKILL the runner that holds `request_id`; its id."""
    holder = platform.redis().hget(keys.request(request_id), "runner").decode()
    [runner] = [r for r in _ready(admin) if r["id"] == holder]
    os.kill(runner["pid"], signal.SIGKILL)
    return holder


def _stream(admin: httpx.Client, kill_after: int | None, platform: Platform) -> dict:
    """One streamed answer (its runner killed after `kill_after` chunks): the chunks."""
    with admin.stream("POST", "/v1/chat/completions", json=_body(True), timeout=120) as r:
        assert r.status_code == 200
        request_id = r.headers["x-request-id"]
        chunks = []
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks.append(json.loads(line[len("data: ") :]))
            if len(chunks) == kill_after:
                _kill_holder(platform, admin, request_id)
    return {"id": request_id, "chunks": chunks}


def _text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def _logprob_tokens(chunks: list[dict]) -> list[str]:
    return [
        t["token"]
        for c in chunks
        if c["choices"] and c["choices"][0].get("logprobs")
        for t in c["choices"][0]["logprobs"]["content"]
    ]


def test_a_stream_whose_runner_is_sigkilled_goes_on_on_another_runner(platform, admin, served):
    baseline = _stream(admin, None, platform)
    killed = _stream(admin, 30, platform)
    chunks = killed["chunks"]
    assert not any("error" in c for c in chunks), "no error event: it went on"
    assert _text(chunks) == _text(baseline["chunks"]), "greedy: the uninterrupted text"
    assert len(_text(chunks)) == TOKENS, "one byte a token: nothing repeated or missing"
    assert _logprob_tokens(chunks) == _logprob_tokens(baseline["chunks"])
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert reasons[-1] == "length" and reasons.count("length") == 1
    [usage] = [c["usage"] for c in chunks if c.get("usage")]
    [base_usage] = [c["usage"] for c in baseline["chunks"] if c.get("usage")]
    assert usage == base_usage, "prompt once, every delivered token once"
    assert usage["completion_tokens"] == TOKENS
    wait_until(
        lambda: [u for u in raw_usage(platform.redis()) if u.request_id == killed["id"]],
        30,
        "its usage record",
    )
    billed = [u for u in raw_usage(platform.redis()) if u.request_id == killed["id"]]
    assert [(u.prompt_tokens, u.completion_tokens) for u in billed] == [
        (base_usage["prompt_tokens"], TOKENS)
    ], "billed once"
    # A client replaying the stream from Redis (the resume route) sees what the live one saw.
    replayed = admin.get(f"/v1/chat/completions/{killed['id']}/stream", timeout=60)
    assert replayed.status_code == 200
    again = [
        json.loads(line[len("data: ") :])
        for line in replayed.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    assert not any("error" in c for c in again)
    assert _text(again) == _text(chunks)
    assert _logprob_tokens(again) == _logprob_tokens(chunks)
    wait_until(lambda: len(_ready(admin)) == 2, 60, "the lost runner to be replaced")


def test_a_non_streamed_answer_whose_runner_is_sigkilled_goes_on(platform, admin, served):
    baseline = admin.post("/v1/chat/completions", json=_body(False), timeout=120).json()
    result: dict = {}

    def ask() -> None:
        result["response"] = admin.post("/v1/chat/completions", json=_body(False), timeout=120)

    asking = threading.Thread(target=ask)
    asking.start()
    r = platform.redis()

    def holding_output() -> str | None:
        for raw in r.zrange(keys.LEASES, 0, -1):
            request_id = raw.decode()
            if r.xlen(keys.events(request_id)) > 30:
                return request_id
        return None

    request_id = wait_until(holding_output, 60, "the request to be well under way")
    _kill_holder(platform, admin, request_id)
    asking.join(120)
    response = result["response"]
    assert response.status_code == 200, response.text
    body = response.json()
    choice, base = body["choices"][0], baseline["choices"][0]
    assert choice["message"]["content"] == base["message"]["content"]
    assert choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["content"]) == TOKENS
    assert body["usage"] == baseline["usage"]
    # Continued from its output, not run again from the start (a rerun says the same).
    fields = r.hgetall(keys.request(request_id))
    assert fields[b"continuations"] == b"1" and b"reruns" not in fields
    wait_until(lambda: len(_ready(admin)) == 2, 60, "the lost runner to be replaced")
