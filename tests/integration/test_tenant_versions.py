"""Versions inside the tenant boundary (issue 32, findings 3-5), on the whole platform with
a fake four-GPU inventory: a tenant's versions and rollouts count against its GPU and
replica quotas, a deployment keeps a bounded number of versions, jobs and batch lines
follow the traffic split (what was queued for a retired version moves and runs on the
serving one), and the Batch API's discount is the admin's."""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest
from support import Platform, deploy, fake_gpu_inventory, temp_home, wait_until
from support.billing import new_key, tenant_client

from ebb.queue import keys
from ebb.queue.schema import UsageRecord
from ebb.queue.version_store import MAX_VERSIONS_KEPT
from ebb.queue.versions import split_unit

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform():
    home = temp_home("ebb-it-tenant-versions-")
    inventory = fake_gpu_inventory(home, 4)
    p = Platform(home=home, redis_url=None, env_extra={"EBB_GPU_INVENTORY_FILE": str(inventory)})
    p.start()
    yield p
    assert p.stop() == 0


def _tenant(platform: Platform, admin: httpx.Client, name: str, **quota) -> httpx.Client:
    body = {"max_deployments": 1, "allowed_sources": ["fake://"], **quota}
    r = admin.put(f"/v1/tenants/{name}/quota", json=body)
    assert r.status_code == 200, r.text
    return tenant_client(platform, new_key(admin, name))


def _refused(response: httpx.Response, status: int, param: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    return error["message"]


def _versions(client: httpx.Client, name: str) -> list[int]:
    r = client.get(f"/v1/deployments/{name}/versions")
    assert r.status_code == 200, r.text
    return [v["version"] for v in r.json()["data"]]


def test_a_new_version_and_its_rollout_count_against_the_gpu_quota(platform, admin):
    acme = _tenant(platform, admin, "gpu-t", max_replicas=4, max_gpus=2)
    assert acme.post("/v1/deployments", json={"name": "gpu-t-m", "source": "fake://a"}).is_success
    # Finding 3: the same name with tensor_parallel_size 4 would run on 4 GPUs.
    big = acme.post(
        "/v1/deployments",
        json={"name": "gpu-t-m", "source": "fake://a", "engine": {"tensor_parallel_size": 4}},
    )
    assert "up to 4 GPUs" in _refused(big, 403, "max_gpus")
    assert _versions(acme, "gpu-t-m") == [1]
    # Two GPUs alone fit; beside version 1 during a rollout they would hold 3.
    two = acme.post(
        "/v1/deployments",
        json={"name": "gpu-t-m", "source": "fake://a", "engine": {"tensor_parallel_size": 2}},
    )
    assert two.status_code == 201, two.text
    rollout = acme.post("/v1/deployments/gpu-t-m/rollout", json={"version": 2})
    assert "up to 3 GPUs" in _refused(rollout, 403, "max_gpus")
    one = acme.post(
        "/v1/deployments",
        json={"name": "gpu-t-m", "source": "fake://b", "engine": {"tensor_parallel_size": 1}},
    )
    assert one.json()["deployed_version"] == 3
    assert acme.post("/v1/deployments/gpu-t-m/rollout", json={"version": 3}).status_code == 200
    # The quota view counts both ends of the rollout; replicas may not grow past it.
    assert acme.get("/v1/tenants/gpu-t/quota").json()["use"]["gpus"] == 2
    more = acme.patch("/v1/deployments/gpu-t-m", json={"max_replicas": 2})
    assert "up to 4 GPUs" in _refused(more, 403, "max_gpus")


def test_versions_kept_are_bounded_for_tenants_and_the_admin(platform, admin):
    acme = _tenant(platform, admin, "ver-t", max_replicas=1, max_gpus=1, max_versions=3)
    body = {"name": "ver-t-m", "source": "fake://a"}
    assert acme.post("/v1/deployments", json=body).is_success
    for n in (2, 3):
        assert acme.post("/v1/deployments", json=body).json()["deployed_version"] == n
    fourth = _refused(acme.post("/v1/deployments", json=body), 403, "max_versions")
    assert "DELETE /v1/deployments/ver-t-m/versions/N" in fourth
    # The serving version and the latest are kept; an old one without traffic goes.
    assert acme.delete("/v1/deployments/ver-t-m/versions/1").status_code == 409
    assert acme.delete("/v1/deployments/ver-t-m/versions/3").status_code == 409
    assert acme.delete("/v1/deployments/ver-t-m/versions/2").status_code == 200
    assert acme.post("/v1/deployments", json=body).json()["deployed_version"] == 4
    assert _versions(acme, "ver-t-m") == [1, 3, 4]

    deploy(admin, "ver-admin", source="fake://a")
    for _ in range(MAX_VERSIONS_KEPT - 1):
        r = admin.post("/v1/deployments", json={"name": "ver-admin", "source": "fake://a"})
        assert r.status_code == 201, r.text
    past = admin.post("/v1/deployments", json={"name": "ver-admin", "source": "fake://a"})
    assert past.status_code == 409 and "versions" in past.json()["error"]["message"]


def test_the_batch_discount_is_the_admins(platform, admin):
    acme = _tenant(platform, admin, "disc-t", max_replicas=1, max_gpus=1)
    free = {"name": "disc-t-m", "source": "fake://a", "serving": {"batch_discount_pct": 100}}
    assert "admin" in _refused(acme.post("/v1/deployments", json=free), 403,
                               "serving.batch_discount_pct")  # fmt: skip
    assert acme.post("/v1/deployments", json={"name": "disc-t-m", "source": "fake://a"}).is_success
    patched = acme.patch("/v1/deployments/disc-t-m", json={"serving": {"batch_discount_pct": 100}})
    _refused(patched, 403, "serving.batch_discount_pct")
    again = acme.post("/v1/deployments", json=free)
    _refused(again, 403, "serving.batch_discount_pct")
    assert _versions(acme, "disc-t-m") == [1]


def _job(client: httpx.Client, model: str) -> str:
    body = {"model": model, "endpoint": "chat.completions",
            "body": {"messages": MESSAGES, "max_tokens": 4}}  # fmt: skip
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _succeeded(client: httpx.Client, job_id: str) -> bool:
    return client.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"


def _served_by(r, deployment: str) -> list[tuple[int, int]]:
    """Per request of `deployment` that ran: the version it was recorded as, and the
    version of the runner that ran it."""
    found = []
    for _, fields in r.xrange(keys.USAGE):
        usage = msgspec.json.decode(fields[b"r"], type=UsageRecord)
        if usage.deployment == deployment:
            unit = r.hget(keys.runner(usage.runner_id), "deployment")
            assert unit, f"runner {usage.runner_id} has no record"
            found.append((usage.version, split_unit(unit.decode())[1]))
    return found


def test_jobs_and_batch_lines_follow_the_split_and_queued_ones_move(platform, admin):
    r = platform.redis()
    # Version 1 takes long to load: its jobs are still queued when version 2 takes over.
    deploy(admin, "follow", source="fake://a?load_s=60", idle_timeout_s=600)
    early = [_job(admin, "follow") for _ in range(3)]
    assert r.zcard(keys.job_queue("follow")) == 3
    assert admin.post("/v1/deployments", json={"name": "follow", "source": "fake://b"}).is_success
    assert admin.post("/v1/deployments/follow/rollout", json={"version": 2}).status_code == 200
    wait_until(
        lambda: (
            admin.get("/v1/deployments/follow/versions").json()["traffic"] == {"1": 0, "2": 100}
        ),
        60,
        "version 2 to take all the traffic",
    )
    late = _job(admin, "follow")
    client = platform.openai()
    lines = [
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "follow", "messages": MESSAGES, "max_tokens": 4}}
        for i in range(5)
    ]  # fmt: skip
    content = "\n".join(json.dumps(line) for line in lines).encode() + b"\n"
    uploaded = client.files.create(file=("in.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    for job_id in [*early, late]:
        wait_until(lambda j=job_id: _succeeded(admin, j), 40, f"job {job_id} to succeed")
    done = wait_until(
        lambda: (b := client.batches.retrieve(batch.id)).status == "completed" and b,
        40,
        "the batch to complete",
    )
    assert done.request_counts.completed == 5
    # Every job and batch line ran once, on version 2, and was recorded as version 2.
    assert _served_by(r, "follow") == [(2, 2)] * 9
    assert r.zcard(keys.job_queue("follow")) == 0
