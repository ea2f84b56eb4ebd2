"""Bounded Redis memory through the whole platform (`ebb up`, fake engine, short
retention): what a request or a job leaves in Redis (request records, output streams,
job records, webhook deliveries, the tenant's job listing) expires on schedule, and
`/v1/status` shows Redis's memory."""

from __future__ import annotations

import pytest
from support import Platform, deploy, temp_home, wait_until
from test_jobs import FAST_RETRIES, job_body, settled, submit

from ebb.queue import keys

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
RETENTION_S = 2
SHORT = {
    **FAST_RETRIES,
    "EBB_RESULT_TTL_S": str(RETENTION_S),
    "EBB_JOB_RETENTION_S": str(RETENTION_S),
    "EBB_WEBHOOK_GIVE_UP_S": "1",
}
# Per request and per job: everything here must be gone after the retention window.
PER_WORK = [
    keys.REQUEST_PREFIX,
    keys.EVENTS_PREFIX,
    keys.JOB_PREFIX,
    keys.DELIVERY_PREFIX,
    keys.delivery_attempts(""),
    keys.job_deliveries(""),
]


@pytest.fixture(scope="module")
def platform():
    p = Platform(home=temp_home("ebb-redis-mem-"), redis_url=None, env_extra=SHORT).start()
    yield p
    assert p.stop() == 0


def per_work_keys(client) -> list[bytes]:
    found = []
    for prefix in PER_WORK:
        found += list(client.scan_iter(match=prefix + "*", count=1000))
    return found


def test_results_jobs_and_deliveries_expire_on_schedule(platform, admin, receiver):
    client = platform.redis()
    deploy(admin, "mem")
    tenant_key = admin.post("/v1/keys", json={"tenant": "soak"}).json()["key"]
    tenant = {"Authorization": f"Bearer {tenant_key}"}
    for stream in (False, True):
        body = {"model": "mem", "messages": MESSAGES, "max_tokens": 4, "stream": stream}
        assert admin.post("/v1/chat/completions", json=body).status_code == 200
    jobs = [submit(admin, job_body("mem", receiver.url), headers=tenant) for _ in range(3)]
    for job in jobs:
        assert settled(admin, job["id"])["status"] == "succeeded"
        wait_until(lambda j=job["id"]: receiver.accepted(j), 30, "its webhook")
    assert per_work_keys(client), "the work left records while it was retained"
    assert client.zcard(keys.tenant_jobs("soak")) == 3
    wait_until(lambda: not per_work_keys(client), 60, "every per-request/job key to expire")
    for job in jobs:
        assert admin.get(f"/v1/jobs/{job['id']}").status_code == 404
    # The listing has no TTL; new submissions drop the expired ids from it.
    submit(admin, job_body("mem"), headers=tenant)
    submit(admin, job_body("mem"), headers=tenant)
    assert client.zcard(keys.tenant_jobs("soak")) <= 2


def test_status_shows_redis_memory(platform, admin):
    memory = admin.get("/v1/status").json()["redis"]
    assert 0 < memory["used_memory_bytes"] <= memory["used_memory_peak_bytes"]
    shown = platform.cli("status")
    assert shown.returncode == 0, shown.stderr
    assert "redis memory:" in shown.stdout and "MiB used" in shown.stdout
