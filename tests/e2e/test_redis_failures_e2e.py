"""Failures on the real engine (`ebb up`, default model, vLLM): a stream rides out a
SIGKILLed Redis (which `ebb up` restarts), and a non-streaming request whose runner is
SIGKILLed mid-generation goes on on a new runner (continued from its tokens so far) and is
billed once."""

from __future__ import annotations

import json
import os
import signal
import threading

import psutil
import pytest
from support import real_engine_platform, wait_until

from ebb.config import DEFAULT_MODEL_NAME
from ebb.queue import keys

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform(default_local_model):
    # A fresh runner takes ~15 s to start on CPU: the rerun must be admitted meanwhile.
    with real_engine_platform(
        "ebb-e2e-redis-", default_model=True, EBB_ADMISSION_TIMEOUT_S="90"
    ) as p:
        yield p


def _redis_pid(platform) -> int:
    children = psutil.Process(platform.proc.pid).children()
    live = [c.pid for c in children if c.name() == "redis-server" and c.status() != "zombie"]
    return live[0] if live else 0


def test_a_stream_rides_out_a_killed_redis(platform):
    client = platform.openai(timeout=180)
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=QUESTION,
        temperature=0,
        max_tokens=48,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [next(stream)]
    old = _redis_pid(platform)
    os.kill(old, signal.SIGKILL)
    chunks += list(stream)  # raises on an error event or a cut connection
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert wait_until(lambda: _redis_pid(platform) not in (0, old), 30, "a new redis-server")


def test_a_runner_killed_mid_generation_reruns_a_non_streamed_request(platform, admin):
    redis = platform.redis()
    # A long answer, so the runner is killed while it is still generating.
    essay = [{"role": "user", "content": "Write a long essay about the history of Paris."}]
    body = {"model": DEFAULT_MODEL_NAME, "messages": essay, "temperature": 0, "max_tokens": 400}
    result: dict = {}

    def call() -> None:
        response = admin.post("/v1/chat/completions", json=body, timeout=300)
        result.update(status=response.status_code, body=response.json(), headers=response.headers)

    thread = threading.Thread(target=call)
    thread.start()
    wait_until(lambda: redis.zcard(keys.LEASES) == 1, 120, "the request claimed")
    runners = admin.get(f"/v1/deployments/{DEFAULT_MODEL_NAME}").json()["runners"]
    [victim] = [r for r in runners if r["state"] == "ready"]
    os.kill(victim["pid"], signal.SIGKILL)
    thread.join(timeout=300)
    assert result["status"] == 200, result
    assert "Paris" in result["body"]["choices"][0]["message"]["content"]
    request_id = result["headers"]["X-Request-Id"]

    def billed() -> list[dict]:
        records = [json.loads(f[b"r"]) for _, f in redis.xrange(keys.USAGE)]
        return [r for r in records if r["request_id"] == request_id]

    wait_until(billed, 30, "the usage record")
    [record] = billed()
    assert record["completion_tokens"] == result["body"]["usage"]["completion_tokens"]
    assert record["runner_id"] != victim["id"]
