"""A Kubernetes runner is billed for the GPUs its pod holds, not for one: the launcher
names them in the pod's environment (the device plugin does not set
CUDA_VISIBLE_DEVICES), and `held_gpus` reads them."""

from __future__ import annotations

from ebb.coldstart.k8s_pods import PodTemplate, RunnerShape, runner_pod
from ebb.coldstart.placement import Placement
from ebb.gpus.count import HELD_GPUS_ENV, held_gpus
from ebb.launching.tiers import Tier
from ebb.queue.gpu_records import GpuPlacement

TEMPLATE = PodTemplate(namespace="ebb", image="ebb:cuda")


def env_of(pod: dict) -> dict[str, str]:
    [container] = pod["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_a_pod_names_the_gpus_it_asks_for_and_the_runner_is_billed_for_them() -> None:
    pod = runner_pod(
        TEMPLATE, "r-1", "big", Tier.FRESH, shape=RunnerShape(gpus=4), placement=Placement()
    )
    env = env_of(pod)
    assert env[HELD_GPUS_ENV] == "4"
    assert held_gpus(None, env) == 4


def test_a_cpu_pod_names_none() -> None:
    pod = runner_pod(
        TEMPLATE, "r-2", "small", Tier.FRESH, shape=RunnerShape(), placement=Placement()
    )
    assert HELD_GPUS_ENV not in env_of(pod)
    assert held_gpus(None, env_of(pod)) == 0


def test_a_placement_or_visible_devices_still_decide_first() -> None:
    placement = GpuPlacement(
        host="n", device_indexes=[0, 1], reserved_bytes_per_device=1, gpu_memory_utilization=0.9
    )
    assert held_gpus(placement, {HELD_GPUS_ENV: "4"}) == 2
    assert held_gpus(None, {"CUDA_VISIBLE_DEVICES": "0,1,2"}) == 3
    assert held_gpus(None, {HELD_GPUS_ENV: "junk"}) == 0
