"""Continuation by token replay on the real engine (`ebb up`, default model, vLLM): a
greedy stream whose runner is SIGKILLed after 30 chunks goes on on a new runner (prefilling
the prompt and the tokens so far) and ends as an uninterrupted run does: the same text,
a logprob for every token, one usage."""

from __future__ import annotations

import json
import os
import signal

import pytest
from support import real_engine_platform, wait_until

from ebb.config import DEFAULT_MODEL_NAME
from ebb.queue import keys

pytestmark = pytest.mark.e2e

TOKENS = 120
QUESTION = [{"role": "user", "content": "Write a long essay about the history of Paris."}]


@pytest.fixture(scope="module")
def platform(default_local_model):
    # A fresh runner takes ~15 s to start on CPU: the continuation waits for it.
    with real_engine_platform(
        "ebb-e2e-cont-", default_model=True, EBB_ADMISSION_TIMEOUT_S="120"
    ) as p:
        yield p


def _stream(platform, admin, kill_after: int | None) -> tuple[str, list[dict]]:
    body = {
        "model": DEFAULT_MODEL_NAME,
        "messages": QUESTION,
        "temperature": 0,
        "max_tokens": TOKENS,
        "ignore_eos": True,  # exactly TOKENS tokens, wherever the model would stop
        "logprobs": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks: list[dict] = []
    with admin.stream("POST", "/v1/chat/completions", json=body, timeout=300) as response:
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :]))
            if kill_after is not None and len(chunks) == kill_after:
                holder = platform.redis().hget(keys.request(request_id), "runner").decode()
                runners = admin.get(f"/v1/deployments/{DEFAULT_MODEL_NAME}").json()["runners"]
                [victim] = [r for r in runners if r["id"] == holder]
                os.kill(victim["pid"], signal.SIGKILL)
    return request_id, chunks


def _text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def _logprobs(chunks: list[dict]) -> int:
    return sum(
        len((c["choices"][0].get("logprobs") or {}).get("content") or [])
        for c in chunks
        if c["choices"]
    )


def test_a_killed_runners_stream_goes_on_as_if_uninterrupted(platform, admin):
    _, baseline = _stream(platform, admin, None)
    request_id, chunks = _stream(platform, admin, 30)
    assert not [c for c in chunks if "error" in c], "no error event: it went on"
    assert _text(chunks) == _text(baseline), "greedy: the uninterrupted text"
    assert _logprobs(chunks) == TOKENS, "a logprob for every token, none twice"
    [usage] = [c["usage"] for c in chunks if c.get("usage")]
    [base_usage] = [c["usage"] for c in baseline if c.get("usage")]
    assert usage == base_usage and usage["completion_tokens"] == TOKENS
    redis = platform.redis()

    def billed() -> list[dict]:
        records = [json.loads(f[b"r"]) for _, f in redis.xrange(keys.USAGE)]
        return [r for r in records if r["request_id"] == request_id]

    wait_until(billed, 30, "the usage record")
    [record] = billed()
    assert (record["prompt_tokens"], record["completion_tokens"]) == (
        base_usage["prompt_tokens"],
        TOKENS,
    )
