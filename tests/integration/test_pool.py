"""The pre-warmed pool with real processes: a stem serves the first request at zero and
the pool refills. The controller's decisions about the pool (refill timing, dead stems
skipped and replaced) are tested on simulated runners in tests/unit/test_controller.py."""

from __future__ import annotations

import pytest
from support import Platform, temp_home, wait_until

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform():
    # `ebb up` prints ready only once the pool holds its stem (engine libraries imported).
    p = Platform(home=temp_home("ebb-pool-"), redis_url=None, env_extra={"EBB_PREWARM": "1"})
    yield p.start()
    assert p.stop() == 0


def stems(admin) -> list[dict]:
    return [r for r in admin.get("/v1/status").json()["runners"] if r["deployment"] is None]


def test_a_stem_serves_the_first_request_and_the_pool_refills(platform):
    with platform.admin() as admin:
        pool = admin.get("/v1/status").json()["pool"]
        assert pool == {"target": 1, "prewarmed": 1, "starting": 0}
        first_stem = stems(admin)[0]["id"]
        created = admin.post("/v1/deployments", json={"name": "pooled", "source": "fake://m"})
        assert created.status_code == 201
        reply = platform.openai().chat.completions.create(
            model="pooled", messages=MESSAGES, max_tokens=3
        )
        assert reply.usage.completion_tokens == 3
        runners = admin.get("/v1/deployments/pooled").json()["runners"]
        assert [(r["id"], r["tier"]) for r in runners] == [(first_stem, "prewarmed")]
        refilled = wait_until(
            lambda: [s for s in stems(admin) if s["state"] == "prewarmed"],
            120,
            "a new stem to join the pool",
        )
        assert refilled[0]["id"] != first_stem
