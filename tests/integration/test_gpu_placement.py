"""GPU placement on the whole platform, with a fake NVML inventory (three 24 GiB GPUs)
and fake engines that state their memory need: packing, tensor parallelism, refusal with
the numbers (a deployment shown unschedulable, its requests a 503 that says why), and
GPU-seconds billed per GPU held."""

from __future__ import annotations

import json

import pytest
from support import Platform, deploy, deployment, fake_gpu_inventory, temp_home, wait_until

from ebb.queue import keys
from ebb.queue.metering import decode_gpu_entry

pytestmark = pytest.mark.integration

GIB = 1024**3
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform():
    home = temp_home("ebb-it-gpu-")
    inventory = fake_gpu_inventory(home, 3)
    p = Platform(home=home, redis_url=None, env_extra={"EBB_GPU_INVENTORY_FILE": str(inventory)})
    p.start()
    yield p
    assert p.stop() == 0


def ready_runner(admin, name: str) -> dict:
    return wait_until(
        lambda: next(
            (r for r in deployment(admin, name)["runners"] if r["state"] == "ready"), None
        ),
        30,
        f"a ready runner of {name}",
    )


def gpus_of(admin, runner_id: str) -> list[int]:
    status = admin.get("/v1/status").json()
    return next(r["gpus"] for r in status["runners"] if r["id"] == runner_id)


def test_inventory_is_published(admin):
    status = wait_until(
        lambda: (s := admin.get("/v1/status").json())["gpus"] and s, 10, "the inventory"
    )
    [host] = status["gpus"]
    assert [d["index"] for d in host["devices"]] == [0, 1, 2]
    assert host["devices"][0]["total_bytes"] == 24 * GIB
    assert host["devices"][0]["temperature_c"] == 30


def test_two_deployments_pack_onto_one_gpu(admin):
    deploy(admin, "small-a", source="fake://a?gpu_gib=8", min_replicas=1)
    a = ready_runner(admin, "small-a")
    deploy(admin, "small-b", source="fake://b?gpu_gib=8", min_replicas=1)
    b = ready_runner(admin, "small-b")
    assert gpus_of(admin, a["id"]) == gpus_of(admin, b["id"]) == [0]
    [host] = admin.get("/v1/status").json()["gpus"]
    assert sorted(host["devices"][0]["runners"]) == sorted([a["id"], b["id"]])
    assert host["devices"][0]["reserved_bytes"] == 16 * GIB


def test_a_model_larger_than_one_gpu_is_split_over_two(admin, platform_redis):
    deploy(admin, "large", source="fake://large?gpu_gib=30", min_replicas=1)
    runner = ready_runner(admin, "large")
    assert gpus_of(admin, runner["id"]) == [1, 2]
    # Billed for both GPUs it holds, from launch on; the packed ones for one each.
    wait_until(
        lambda: any(
            s.meter.runner_id == runner["id"]
            for s in map(decode_gpu_entry, _gpu_fields(platform_redis))
        ),
        30,
        "a GPU-time segment of the large runner",
    )
    segments = [decode_gpu_entry(f) for f in _gpu_fields(platform_redis)]
    counts = {
        s.meter.deployment: s.meter.gpu_count for s in segments if s.meter.deployment != "(pool)"
    }
    assert counts["large"] == 2
    assert counts["small-a"] == 1


def test_nothing_fits_is_unschedulable_and_a_503_that_says_why(admin, platform):
    deploy(admin, "huge", source="fake://huge?gpu_gib=16", admission_timeout_s=3)
    response = admin.post(
        "/v1/chat/completions", json={"model": "huge", "messages": MESSAGES, "max_tokens": 4}
    )
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "deployment_unschedulable"
    assert (
        "needs 16.0 GiB + 40 % beside another model, largest free 9.0 GiB on GPU 1"
        in error["message"]
    )
    view = deployment(admin, "huge")
    assert view["status"] == "unschedulable"
    assert view["runners"] == []
    # Freed memory makes it schedulable again: the packed deployments go away.
    for name in ("small-a", "small-b", "large"):
        assert admin.delete(f"/v1/deployments/{name}").status_code == 200
    wait_until(
        lambda: (
            not any(
                r["state"] in ("ready", "draining")
                for r in admin.get("/v1/status").json()["runners"]
            )
        ),
        30,
        "the other runners to exit",
    )
    reply = wait_until(
        lambda: (
            (
                r := admin.post(
                    "/v1/chat/completions",
                    json={"model": "huge", "messages": MESSAGES, "max_tokens": 4},
                )
            ).status_code
            == 200
            and r
        ),
        60,
        "the huge deployment to be placed once the GPUs are free",
    )
    assert reply.json()["usage"]["completion_tokens"] == 4
    assert deployment(admin, "huge")["status"] != "unschedulable"


def _gpu_fields(client) -> list:
    return [fields for _, fields in client.xrange(keys.GPU_USAGE)]


def test_engine_options_through_the_cli_and_api(admin, platform):
    created = platform.cli(
        "deploy",
        "opts",
        "--source",
        "fake://opts",
        "--dtype",
        "bfloat16",
        "--max-num-seqs",
        "64",
        "--prefix-caching",
        "--tp",
        "2",
        "--gpu-memory-gib",
        "12",
        "--json",
    )
    assert created.returncode == 0, created.stderr
    engine = json.loads(created.stdout)["engine"]
    assert engine == {
        "dtype": "bfloat16",
        "quantization": None,
        "max_num_seqs": 64,
        "tensor_parallel_size": 2,
        "enable_prefix_caching": True,
        "gpu_memory_gib": 12.0,
        "enforce_eager": None,
        "accelerator": None,
        "host_memory_gib": None,
        "enable_lora": None,
        "max_loras": None,
        "max_lora_rank": None,
        "max_cpu_loras": None,
    }
    shown = platform.cli("deployments", "show", "opts")
    assert shown.returncode == 0, shown.stderr
    assert "dtype bfloat16" in shown.stdout and "tensor_parallel_size 2" in shown.stdout
    status = platform.cli("status")
    assert status.returncode == 0 and "Fake 24G" in status.stdout

    # More GPUs than the host has: a 400 that names the option and what to change.
    refused = admin.post(
        "/v1/deployments",
        json={"name": "tp8", "source": "fake://x", "engine": {"tensor_parallel_size": 8}},
    )
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "engine.tensor_parallel_size"
    assert "the largest host has 3 GPUs: lower it to 2" in error["message"]
    patched = admin.patch("/v1/deployments/opts", json={"engine": {"quantization": "fp7"}})
    assert patched.status_code == 400 and patched.json()["error"]["param"] == "engine.quantization"
    patched = admin.patch("/v1/deployments/opts", json={"engine": {"enforce_eager": True}})
    assert patched.status_code == 200
    assert patched.json()["engine"]["enforce_eager"] is True
    assert patched.json()["engine"]["dtype"] == "bfloat16"  # a patch merges
