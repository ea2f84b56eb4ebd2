"""The sleeping tier's GPU accounting on one fake 24 GiB GPU: a sleeping runner frees its
device for another deployment, is not woken while the device has no room for it (its
deployment is unschedulable meanwhile, with a 503 that says so), and is woken once the
device is free again; sleepers beyond the host-RAM budget for their offloaded weights
exit, oldest first."""

from __future__ import annotations

import pytest
from support import Platform, deploy, deployment, fake_gpu_inventory, temp_home, wait_until

pytestmark = pytest.mark.integration

GIB = 1024**3
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform():
    home = temp_home("ebb-it-gpu-sleep-")
    inventory = fake_gpu_inventory(home, 1)
    env = {"EBB_GPU_INVENTORY_FILE": str(inventory), "EBB_SLEEP_HOST_RAM_BYTES": "20GiB"}
    p = Platform(home=home, redis_url=None, env_extra=env)
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
    # The first start may take longer than the 3 s window on a busy machine: ask again.
    wait_until(lambda: chat(admin, "sleepy").status_code == 200, 60, "a first answer")
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


def test_sleepers_beyond_the_host_ram_budget_exit_oldest_first(admin):
    assert admin.delete("/v1/deployments/sleepy").status_code == 200
    first = asleep(admin, "old", "fake://old?gpu_gib=12&sleep=1")
    second = asleep(admin, "new", "fake://new?gpu_gib=12&sleep=1")
    # 2 × 12 GiB of weights in host RAM is over the 20 GiB budget: the older one goes.
    wait_until(
        lambda: runners(admin, "old")[0]["state"] == "exited", 30, "the older sleeper to exit"
    )
    assert runners(admin, "old")[0]["id"] == first["id"]
    assert [(r["id"], r["state"]) for r in runners(admin, "new")] == [(second["id"], "sleeping")]


def asleep(admin, name: str, source: str) -> dict:
    deploy(admin, name, source=source, idle_timeout_s=1)
    assert chat(admin, name).status_code == 200
    [runner] = wait_until(
        lambda: (r := runners(admin, name)) and r[0]["state"] == "sleeping" and r,
        30,
        f"{name} to fall asleep",
    )
    return runner
