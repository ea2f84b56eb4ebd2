"""Async jobs and signed webhooks through the whole platform (`ebb up`, fake engine) and a
local webhook receiver: results, signatures, retries, SSRF refusals, idempotency, cancel."""

from __future__ import annotations

import httpx
import pytest
import redis
from standardwebhooks import Webhook
from support import Platform, temp_home, wait_until
from support.webhook_receiver import Receiver
from test_cli import ebb, ok_json

from ebb.queue import keys
from ebb.testing.fake_model import FAKE_REPLY

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
SETTLED = ("succeeded", "failed", "cancelled", "expired")
# Webhook retries a few tenths of a second apart, so a test sees several within seconds.
FAST_RETRIES = {
    "EBB_WEBHOOK_ALLOWED_CIDRS": "127.0.0.0/8",
    "EBB_WEBHOOK_RETRY_BASE_S": "0.2",
    "EBB_WEBHOOK_RETRY_MAX_DELAY_S": "1",
}


@pytest.fixture(scope="module")
def platform():
    # A 30 s controller poll: a job wakes its deployment at zero through the wake-up
    # signal, like a synchronous request, not through the periodic reconcile.
    env = {**FAST_RETRIES, "EBB_CONTROLLER_POLL_S": "30"}
    p = Platform(home=temp_home("ebb-jobs-"), redis_url=None, env_extra=env).start()
    yield p
    assert p.stop() == 0


@pytest.fixture(scope="module")
def redis_client(platform):
    import json

    info = json.loads((platform.home / "run.json").read_text())
    return redis.Redis.from_url(info["redis_url"])


def deploy(admin: httpx.Client, name: str, source: str = "fake://m", **fields) -> None:
    if admin.get(f"/v1/deployments/{name}").status_code == 200:
        return
    response = admin.post("/v1/deployments", json={"name": name, "source": source, **fields})
    assert response.status_code == 201, response.text


def job_body(model: str, url: str | None = None, max_tokens: int = 8, **extra) -> dict:
    body = {
        "model": model,
        "endpoint": "chat.completions",
        "body": {"messages": MESSAGES, "max_tokens": max_tokens},
        **extra,
    }
    if url:
        body["webhook"] = {"url": url}
    return body


def submit(client: httpx.Client, body: dict, **kwargs) -> dict:
    response = client.post("/v1/jobs", json=body, **kwargs)
    assert response.status_code == 202, response.text
    return response.json()


def settled(client: httpx.Client, job_id: str, timeout_s: float = 60) -> dict:
    def view() -> dict | None:
        response = client.get(f"/v1/jobs/{job_id}")
        if response.status_code != 200:
            return None  # the platform may be restarting
        return response.json() if response.json()["status"] in SETTLED else None

    return wait_until(view, timeout_s, f"job {job_id} to settle")


def delivered(client: httpx.Client, job_id: str, count: int) -> list[dict] | None:
    """The job's deliveries once `count` of them exist and all were delivered."""
    deliveries = client.get(f"/v1/jobs/{job_id}").json()["deliveries"]
    if len(deliveries) == count and all(d["status"] == "delivered" for d in deliveries):
        return deliveries
    return None


def test_job_result_and_signed_webhooks(admin, receiver):
    deploy(admin, "jobs-chat", idle_timeout_s=30)
    secret = admin.get("/v1/webhooks/secret").json()["secret"]
    assert secret.startswith("whsec_")
    job = submit(admin, job_body("jobs-chat", receiver.url, metadata={"batch": "7"}))
    assert job["status"] == "queued" and job["id"].startswith("job_")
    assert job["webhook"]["events"] == [
        "job.cancelled",
        "job.failed",
        "job.started",
        "job.succeeded",
    ]
    wait_until(
        lambda: receiver.accepted(job["id"], "job.succeeded"), 60, "the job.succeeded webhook"
    )
    done = settled(admin, job["id"])
    assert done["status"] == "succeeded"
    assert done["result"]["choices"][0]["message"]["content"] == FAKE_REPLY[:8]
    assert done["result"]["object"] == "chat.completion"
    assert done["usage"]["completion_tokens"] == 8 and done["usage"]["prompt_tokens"] > 0
    assert done["metadata"] == {"batch": "7"}
    assert done["timings"]["queued_s"] >= 0 and done["timings"]["run_s"] >= 0

    verifier = Webhook(secret)
    events = [r for r in receiver.received if r.job_id == job["id"]]
    assert sorted(r.event for r in events) == ["job.started", "job.succeeded"]
    for delivery in events:
        assert verifier.verify(delivery.body, delivery.headers)["data"]["id"] == job["id"]
    succeeded = receiver.accepted(job["id"], "job.succeeded")[0].payload
    assert succeeded["data"]["result"] == done["result"]
    assert succeeded["data"]["usage"] == done["usage"]
    assert succeeded["data"]["status"] == "succeeded"
    started = receiver.accepted(job["id"], "job.started")[0].payload
    assert started["data"]["status"] == "running" and started["data"]["result"] is None

    deliveries = wait_until(
        lambda: delivered(admin, job["id"], count=2), 10, "both deliveries recorded as delivered"
    )
    assert {d["event"] for d in deliveries} == {"job.started", "job.succeeded"}
    for d in deliveries:
        assert [a["status_code"] for a in d["attempts"]] == [200]
        assert d["attempts"][0]["latency_ms"] >= 0 and d["attempts"][0]["error"] is None


def test_failing_receiver_gets_the_same_webhook_id_until_it_succeeds(admin):
    receiver = Receiver(fail_first=3).start()
    try:
        body = job_body("jobs-chat")
        body["webhook"] = {"url": receiver.url, "events": ["job.succeeded"]}
        job = submit(admin, body)
        accepted = wait_until(
            lambda: receiver.accepted(job["id"]), 60, "the delivery to get through"
        )
        webhook_id = accepted[0].webhook_id
        attempts = receiver.attempts(webhook_id)
        assert [a.status for a in attempts] == [503, 503, 503, 200]
        assert {a.body for a in attempts} == {accepted[0].body}, "every attempt sends the same body"
        assert {a.event for a in receiver.received} == {"job.succeeded"}, "events are filtered"
        deliveries = wait_until(lambda: delivered(admin, job["id"], 1), 10, "delivered recorded")
        assert deliveries[0]["webhook_id"] == webhook_id
        log = deliveries[0]["attempts"]
        assert [a["status_code"] for a in log] == [503, 503, 503, 200]
        assert [a["error"] for a in log] == ["HTTP 503"] * 3 + [None]
        assert deliveries[0]["next_attempt_at"] is None
    finally:
        receiver.stop()


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.7/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://192.168.1.10:8080/hook",
        "http://[::1]:9000/hook",
        "http://[::ffff:10.0.0.1]/hook",
        "ftp://example.com/hook",
        "not a url",
    ],
)
def test_unsafe_webhook_urls_are_refused(admin, redis_client, url):
    deploy(admin, "jobs-chat", idle_timeout_s=30)
    before = redis_client.zcard(keys.tenant_jobs("admin"))
    response = admin.post("/v1/jobs", json=job_body("jobs-chat", url))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "webhook.url" and error["code"] == "unsafe_webhook_url"
    assert "webhook.url" in error["message"]
    assert redis_client.zcard(keys.tenant_jobs("admin")) == before, "a refused job was stored"
    assert redis_client.zcard(keys.job_queue("jobs-chat")) == 0


def test_idempotency_key_returns_the_same_job(admin):
    deploy(admin, "jobs-chat", idle_timeout_s=30)
    body = job_body("jobs-chat", metadata={"n": "1"})
    first = admin.post("/v1/jobs", json=body, headers={"Idempotency-Key": "order-17"})
    again = admin.post("/v1/jobs", json=body, headers={"Idempotency-Key": "order-17"})
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    changed = admin.post(
        "/v1/jobs", json={**body, "ttl_s": 60}, headers={"Idempotency-Key": "order-17"}
    )
    assert changed.status_code == 409
    assert changed.json()["error"]["code"] == "idempotency_key_reused"
    assert first.json()["id"] in changed.json()["error"]["message"]
    other = admin.post("/v1/jobs", json=body, headers={"Idempotency-Key": "order-18"})
    assert other.status_code == 202 and other.json()["id"] != first.json()["id"]
    assert settled(admin, first.json()["id"])["status"] == "succeeded"


def test_cancel_while_queued_and_while_running(admin, redis_client, receiver):
    # One slot: the long job runs, the short one waits behind it.
    deploy(admin, "jobs-one", source="fake://m?step_ms=20", max_concurrency=1)
    long = submit(admin, job_body("jobs-one", receiver.url, max_tokens=1500))
    wait_until(
        lambda: admin.get(f"/v1/jobs/{long['id']}").json()["status"] == "running",
        30,
        "the long job to run",
    )
    short = submit(admin, job_body("jobs-one", receiver.url, max_tokens=4))
    assert admin.get(f"/v1/jobs/{short['id']}").json()["status"] == "queued"

    cancelled = admin.delete(f"/v1/jobs/{short['id']}")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled" and cancelled.json()["usage"] is None
    assert redis_client.zcard(keys.job_queue("jobs-one")) == 0

    aborted = admin.delete(f"/v1/jobs/{long['id']}").json()
    assert aborted["status"] == "cancelled"
    view = settled(admin, long["id"])
    assert view["status"] == "cancelled"
    generated = view["usage"]["completion_tokens"]
    assert 0 < generated < 1500, "billed for what it generated before the abort"
    billed = [msgspec_json(fields[b"r"]) for _, fields in redis_client.xrange(keys.USAGE)]
    long_bills = [b for b in billed if b["request_id"].startswith(long["id"])]
    assert [(b["state"], b["completion_tokens"]) for b in long_bills] == [("cancelled", generated)]
    assert not [b for b in billed if b["request_id"].startswith(short["id"])]

    wait_until(lambda: receiver.accepted(short["id"], "job.cancelled"), 20, "short's webhook")
    wait_until(lambda: receiver.accepted(long["id"], "job.cancelled"), 20, "long's webhook")
    assert sorted(r.event for r in receiver.accepted(long["id"])) == [
        "job.cancelled",
        "job.started",
    ]
    assert [r.event for r in receiver.accepted(short["id"])] == ["job.cancelled"]
    again = admin.delete(f"/v1/jobs/{long['id']}")
    assert again.status_code == 409 and "already cancelled" in again.json()["error"]["message"]


def test_listing_is_per_tenant_and_paginated(platform, admin):
    deploy(admin, "jobs-chat", idle_timeout_s=30)
    keys_ = [admin.post("/v1/keys", json={"tenant": t}).json()["key"] for t in ("acme", "zeta")]
    acme, zeta = (
        httpx.Client(base_url=platform.base_url, headers={"Authorization": f"Bearer {k}"})
        for k in keys_
    )
    ids = [submit(acme, job_body("jobs-chat"))["id"] for _ in range(3)]
    for job_id in ids:
        settled(acme, job_id)
    page = acme.get("/v1/jobs", params={"limit": 2}).json()
    assert [j["id"] for j in page["data"]] == ids[::-1][:2] and page["has_more"]
    rest = acme.get("/v1/jobs", params={"limit": 2, "after": page["last_id"]}).json()
    assert [j["id"] for j in rest["data"]] == [ids[0]] and not rest["has_more"]
    done = acme.get("/v1/jobs", params={"status": "succeeded"}).json()["data"]
    assert sorted(j["id"] for j in done) == sorted(ids)
    assert acme.get("/v1/jobs", params={"status": "queued"}).json()["data"] == []

    assert zeta.get(f"/v1/jobs/{ids[0]}").status_code == 404
    assert zeta.delete(f"/v1/jobs/{ids[0]}").status_code == 404
    assert zeta.get("/v1/jobs").json()["data"] == []
    assert admin.get(f"/v1/jobs/{ids[0]}").status_code == 200, "admins read any job"
    bad = acme.get("/v1/jobs", params={"status": "done"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "status"
    acme.close()
    zeta.close()


@pytest.mark.parametrize(
    ("change", "status", "param"),
    [
        ({"endpoint": "images"}, 400, "endpoint"),
        ({"endpoint": "embeddings"}, 400, "model"),  # a chat deployment
        ({"body": {"messages": MESSAGES, "stream": True}}, 400, "body.stream"),
        ({"body": {"messages": MESSAGES, "model": "other"}}, 400, "body.model"),
        ({"body": {"messages": MESSAGES, "max_tokens": 0}}, 400, "body.max_tokens"),
        ({"body": {"messages": MESSAGES, "max_tokens": 99_999}}, 400, "body.max_tokens"),
        ({"body": {"prompt": "hi"}}, 400, "body.messages"),
        ({"ttl_s": 10**9}, 400, "ttl_s"),
        ({"ttl_s": 0}, 400, "ttl_s"),
        ({"webhook": {"url": "http://127.0.0.1/x", "events": ["job.exploded"]}}, 400, None),
        ({"surprise": 1}, 400, "surprise"),
        ({"model": "nope"}, 404, "model"),
    ],
)
def test_bad_submissions_are_refused(admin, redis_client, change, status, param):
    deploy(admin, "jobs-chat", idle_timeout_s=30)
    before = redis_client.zcard(keys.tenant_jobs("admin"))
    response = admin.post("/v1/jobs", json={**job_body("jobs-chat"), **change})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"]
    if param:
        assert error["param"] == param
    else:
        assert error["param"].startswith("webhook.events")
    assert redis_client.zcard(keys.tenant_jobs("admin")) == before


def msgspec_json(data: bytes) -> dict:
    import json

    return json.loads(data)


def test_cli_submits_waits_lists_rotates_and_refuses(platform, admin):
    deploy(admin, "jobs-chat", idle_timeout_s=30)
    done = ok_json(
        ebb(
            platform,
            "jobs",
            "submit",
            "jobs-chat",
            "--prompt",
            "Hi",
            "--max-tokens",
            "6",
            "--wait",
            "--json",
        )
    )
    assert done["status"] == "succeeded"
    assert done["result"]["choices"][0]["message"]["content"] == FAKE_REPLY[:6]
    listed = ok_json(ebb(platform, "jobs", "--status", "succeeded", "--json"))
    assert done["id"] in [j["id"] for j in listed["data"]]
    shown = ebb(platform, "jobs", "show", done["id"])
    assert shown.returncode == 0 and done["id"] in shown.stdout
    assert FAKE_REPLY[:6] in shown.stdout

    secret = ebb(platform, "jobs", "secret").stdout.strip()
    assert secret.startswith("whsec_")
    rotated = ok_json(ebb(platform, "jobs", "secret", "--rotate", "--overlap", "60", "--json"))
    assert rotated["secret"] != secret and rotated["previous_secret_expires_at"]

    again = ebb(platform, "jobs", "cancel", done["id"])
    assert again.returncode == 1 and "already succeeded" in again.stderr
    unsafe = ebb(
        platform, "jobs", "submit", "jobs-chat", "--prompt", "x", "--webhook", "http://10.0.0.1/h"
    )
    assert unsafe.returncode == 1 and "webhook.url" in unsafe.stderr
