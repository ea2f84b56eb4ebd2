"""Jobs wait out passing states (issue 36), on the whole platform (`ebb up`, fake engine,
a fake inventory of one 24 GiB GPU) with an external Redis the test stops: a job submitted
while Redis restarts is accepted once it is back (within EBB_REDIS_OUTAGE_S) instead of
refused 503 `redis_unavailable`, and runs; a job for a deployment that fits on no GPU
stays queued showing why, and expires at its TTL naming that condition."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import pytest
from support import (
    Platform,
    RedisServer,
    deploy,
    fake_gpu_inventory,
    free_port,
    temp_home,
    wait_until,
)

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def outside_redis():
    server = RedisServer(port=free_port(), data_dir=temp_home("ebb-redis-restart-")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def platform(outside_redis):
    home = temp_home("ebb-jobs-waiting-")
    env = {
        "EBB_REDIS_OUTAGE_S": "60",
        "EBB_GPU_INVENTORY_FILE": str(fake_gpu_inventory(home, 1)),
    }
    p = Platform(home=home, redis_url=outside_redis.url, env_extra=env)
    yield p.start()
    assert p.stop() == 0


def _while_redis_restarts(platform: Platform, outside_redis: RedisServer, send) -> httpx.Response:
    """`send()` in a thread while Redis is down; Redis comes back once the frontdoor has
    been seen waiting for it."""
    log = platform.home / "logs" / "frontdoor.log"
    waiting = "frontdoor: Redis unavailable"
    seen = log.read_text().count(waiting)
    outside_redis.stop()
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            sent = pool.submit(send)
            wait_until(
                lambda: log.read_text().count(waiting) > seen,
                30,
                "the frontdoor to wait for Redis",
            )
            assert not sent.done()  # not refused: waiting
            outside_redis.start()
            return sent.result(timeout=60)
    finally:
        if outside_redis.proc is None or outside_redis.proc.poll() is not None:
            outside_redis.start()  # not restarted above (a failed wait): a second start
            # would lose the running server, which the module's teardown then never stops


def test_a_job_submitted_while_redis_restarts_is_accepted_and_runs(platform, outside_redis):
    with platform.admin() as admin:
        deploy(admin, "restart")
        key = admin.post("/v1/keys", json={"tenant": "acme"}).json()["key"]
        job = {
            "model": "restart",
            "endpoint": "chat.completions",
            "body": {"messages": MESSAGES, "max_tokens": 3},
        }
        headers = {"Authorization": f"Bearer {key}"}

        def send() -> httpx.Response:
            return httpx.post(f"{platform.base_url}/v1/jobs", json=job, headers=headers, timeout=90)

        response = _while_redis_restarts(platform, outside_redis, send)
        assert response.status_code == 202, response.text
        job_id = response.json()["id"]

        body = wait_until(lambda: _settled(admin, job_id), 60, "the job to settle")
        assert body["status"] == "succeeded", json.dumps(body)
        assert body["usage"]["completion_tokens"] == 3


def _settled(admin: httpx.Client, job_id: str):
    body = admin.get(f"/v1/jobs/{job_id}").json()
    return body["status"] in ("succeeded", "failed", "expired", "cancelled") and body


def test_a_job_for_an_unschedulable_deployment_waits_then_expires_naming_why(platform):
    with platform.admin() as admin:
        deploy(admin, "toobig", source="fake://toobig?gpu_gib=64")
        job = {
            "model": "toobig",
            "endpoint": "completions",
            "body": {"prompt": "hi", "max_tokens": 3},
            "ttl_s": 4,
        }
        response = admin.post("/v1/jobs", json=job)
        assert response.status_code == 202, response.text
        job_id = response.json()["id"]

        def shown_waiting():
            body = admin.get(f"/v1/jobs/{job_id}").json()
            return (body["waiting_for"] or "").startswith("deployment_unschedulable") and body

        wait_until(shown_waiting, 30, "the job to show why it waits")
        body = wait_until(lambda: _settled(admin, job_id), 60, "the job to expire")
        assert body["status"] == "expired", json.dumps(body)
        assert body["error"]["code"] == "expired"
        assert "waiting for deployment_unschedulable" in body["error"]["message"]
        assert "64.0 GiB" in body["error"]["message"]
