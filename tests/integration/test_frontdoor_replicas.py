"""Two frontdoor processes on one Redis behave as one: a deployment, a key, a rate limit
and a job made through one are what the other sees and enforces (frontdoors hold no
platform state of their own, so they run as N replicas behind a Service)."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest
from support import REPO_ROOT, Platform, deploy, free_port, temp_home, wait_until
from support.billing import new_key

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def two_frontdoors(redis_url):
    platform = Platform(home=temp_home("ebb-replicas-"), redis_url=redis_url).start()
    port = free_port()
    log = open(platform.home / "frontdoor-2.log", "wb")  # noqa: SIM115 - closed below
    second = subprocess.Popen(
        [sys.executable, "-m", "ebb", "frontdoor"],
        env={**platform.env(), "EBB_PORT": str(port)},
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(up, 60, "the second frontdoor")
    yield platform, url
    second.send_signal(signal.SIGTERM)
    second.wait(timeout=60)
    log.close()
    assert platform.stop() == 0


def test_what_one_frontdoor_accepts_the_other_serves_and_enforces(two_frontdoors):
    platform, other_url = two_frontdoors
    with platform.admin() as admin:
        deploy(admin, "shared", "fake://m", idle_timeout_s=30)
        key = new_key(admin, "t-replicas", requests_per_minute=2)
        job = admin.post(
            "/v1/jobs",
            json={
                "model": "shared",
                "endpoint": "chat.completions",
                "body": {"messages": MESSAGES},
            },
        )
        assert job.status_code == 202, job.text
    with httpx.Client(
        base_url=other_url, timeout=60, headers={"Authorization": f"Bearer {key}"}
    ) as c:
        body = {"model": "shared", "messages": MESSAGES, "max_tokens": 2}
        statuses = [c.post("/v1/chat/completions", json=body).status_code for _ in range(3)]
    assert statuses == [200, 200, 429], "one key, one limit, whichever frontdoor it reaches"
    with httpx.Client(
        base_url=other_url, timeout=60, headers={"Authorization": f"Bearer {platform.admin_key}"}
    ) as other_admin:
        assert other_admin.get("/v1/deployments/shared").json()["name"] == "shared"
        job_id = job.json()["id"]
        done = wait_until(
            lambda: (
                (j := other_admin.get(f"/v1/jobs/{job_id}").json())["status"] == "succeeded" and j
            ),
            60,
            "the job, seen through the other frontdoor",
        )
    assert done["result"]["choices"][0]["message"]["content"]
