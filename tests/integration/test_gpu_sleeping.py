"""The sleeping tier's GPU accounting on one fake 24 GiB GPU: a sleeping runner frees its
device for another deployment, is not woken while the device has no room for it (its
deployment is unschedulable meanwhile, with a 503 that says so), and is woken once the
device is free again."""

from __future__ import annotations

import json

import pytest
from support import Platform, deploy, deployment, temp_home, wait_until

pytestmark = pytest.mark.integration

GIB = 1024**3
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform():
    home = temp_home("ebb-it-gpu-sleep-")
    home.mkdir(parents=True, exist_ok=True)
    inventory = home / "gpus.json"
    device = {"index": 0, "uuid": "GPU-fake-0", "name": "Fake 24G"}
    inventory.write_text(json.dumps([{**device, "total_bytes": 24 * GIB, "free_bytes": 24 * GIB}]))
    p = Platform(home=home, redis_url=None, env_extra={"EBB_GPU_INVENTORY_FILE": str(inventory)})
    p.start()
    yield p
    assert p.stop() == 0


def chat(admin, model: str):
    return admin.post(
        "/v1/chat/completions", json={"model": model, "messages": MESSAGES, "max_tokens": 4}
    )


def runners(admin, name: str) -> list[dict]:
    return deployment(admin, name)["runners"]


def reserved_gib(admin) -> float:
    [host] = admin.get("/v1/status").json()["gpus"]
    return host["devices"][0]["reserved_bytes"] / GIB


def test_a_sleeper_frees_its_gpu_and_wakes_once_there_is_room(admin):
    deploy(
        admin,
        "sleepy",
        source="fake://s?gpu_gib=12&sleep=1",
        idle_timeout_s=1,
        admission_timeout_s=3,
    )
    assert chat(admin, "sleepy").status_code == 200
    [sleeper] = wait_until(
        lambda: (r := runners(admin, "sleepy")) and r[0]["state"] == "sleeping" and r,
        30,
        "the runner to fall asleep",
    )
    assert reserved_gib(admin) == 0.5  # only its CUDA context

    # Another model fits beside it now (24 - 0.5 > 12 × 1.4) ...
    deploy(admin, "other", source="fake://o?gpu_gib=12", min_replicas=1)
    wait_until(
        lambda: any(r["state"] == "ready" for r in runners(admin, "other")), 30, "other ready"
    )
    # ... so the sleeper cannot come back, and no second runner of it fits either.
    refused = chat(admin, "sleepy")
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "deployment_unschedulable"
    assert "needs 12.0 GiB + 40 % beside another model" in refused.json()["error"]["message"]
    assert [r["state"] for r in runners(admin, "sleepy")] == ["sleeping"]

    assert admin.delete("/v1/deployments/other").status_code == 200
    reply = wait_until(
        lambda: (r := chat(admin, "sleepy")).status_code == 200 and r,
        60,
        "the sleeper to be woken once the GPU is free",
    )
    assert reply.json()["usage"]["completion_tokens"] == 4
    served = runners(admin, "sleepy")
    assert [r["id"] for r in served] == [sleeper["id"]], "the sleeper itself was woken"
    assert served[0]["tier"] == "sleeping"
