"""A job or batch submitted while Redis restarts is accepted once it is back (issue 36),
within EBB_REDIS_OUTAGE_S, instead of being refused 503 `redis_unavailable`; the job then
runs. Whole platform (`ebb up`, fake engine) on an external Redis the test stops."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import pytest
from support import Platform, RedisServer, deploy, free_port, temp_home, wait_until

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def outside_redis():
    server = RedisServer(port=free_port(), data_dir=temp_home("ebb-redis-restart-")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def platform(outside_redis):
    env = {"EBB_REDIS_OUTAGE_S": "60"}
    p = Platform(home=temp_home("ebb-redis-restart-"), redis_url=outside_redis.url, env_extra=env)
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
        outside_redis.start()


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

        def settled():
            body = admin.get(f"/v1/jobs/{job_id}").json()
            return body["status"] in ("succeeded", "failed", "expired") and body

        body = wait_until(settled, 60, "the job to settle")
        assert body["status"] == "succeeded", json.dumps(body)
        assert body["usage"]["completion_tokens"] == 3
