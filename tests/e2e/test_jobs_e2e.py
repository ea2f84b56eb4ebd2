"""Async jobs on the real engine: a job for a deployment at zero scales it up, runs on vLLM,
and its signed webhook carries the same answer GET /v1/jobs/{id} shows."""

from __future__ import annotations

import json

import pytest
import redis
from standardwebhooks import Webhook
from support import real_engine_platform, wait_for_weights, wait_until

from ebb.config import DEFAULT_MODEL_SOURCE
from ebb.queue import keys

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform(default_local_model):
    with real_engine_platform("ebb-e2e-jobs-", EBB_WEBHOOK_ALLOWED_CIDRS="127.0.0.0/8") as p:
        yield p


def test_job_scales_from_zero_and_its_webhook_carries_the_answer(platform, admin, receiver):
    created = admin.post(
        "/v1/deployments",
        json={"name": "smol-jobs", "source": DEFAULT_MODEL_SOURCE, "idle_timeout_s": 30},
    )
    assert created.status_code == 201, created.text
    wait_for_weights(admin, "smol-jobs")
    assert admin.get("/v1/deployments/smol-jobs").json()["status"] == "scaled_to_zero"
    secret = admin.get("/v1/webhooks/secret").json()["secret"]

    submitted = admin.post(
        "/v1/jobs",
        json={
            "model": "smol-jobs",
            "endpoint": "chat.completions",
            "body": {"messages": QUESTION, "temperature": 0, "max_tokens": 32},
            "webhook": {"url": receiver.url},
        },
    )
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]

    [delivery] = wait_until(
        lambda: receiver.accepted(job_id, "job.succeeded"), 300, "the job.succeeded webhook"
    )
    payload = Webhook(secret).verify(delivery.body, delivery.headers)
    answer = payload["data"]["result"]["choices"][0]["message"]["content"]
    assert "Paris" in answer
    for event in receiver.accepted(job_id):
        Webhook(secret).verify(event.body, event.headers)
    assert {e.event for e in receiver.accepted(job_id)} == {"job.started", "job.succeeded"}

    job = admin.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded"
    assert job["result"] == payload["data"]["result"]
    assert job["usage"] == payload["data"]["usage"]
    assert job["usage"]["completion_tokens"] > 0
    assert job["timings"]["queued_s"] > 0, "it waited for a runner to start from zero"

    runners = admin.get("/v1/deployments/smol-jobs").json()["runners"]
    assert [r["state"] for r in runners] == ["ready"], "the job woke exactly one runner"
    run_info = json.loads((platform.home / "run.json").read_text())
    client = redis.Redis.from_url(run_info["redis_url"])
    billed = [json.loads(f[b"r"]) for _, f in client.xrange(keys.USAGE)]
    assert [(b["request_id"], b["completion_tokens"]) for b in billed] == [
        (f"{job_id}.1", job["usage"]["completion_tokens"])
    ]


def test_completions_job_on_the_warm_runner(admin):
    submitted = admin.post(
        "/v1/jobs",
        json={
            "model": "smol-jobs",
            "endpoint": "completions",
            "body": {"prompt": "The capital of France is", "temperature": 0, "max_tokens": 8},
        },
    )
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    job = wait_until(
        lambda: (j := admin.get(f"/v1/jobs/{job_id}").json())["status"] == "succeeded" and j,
        120,
        "the completions job",
    )
    assert job["result"]["object"] == "text_completion"
    assert "Paris" in job["result"]["choices"][0]["text"]
    assert job["deliveries"] == [] and job["webhook"] is None
