"""Runner pods as data: the Pod validates (strict) against the oldest and newest Kubernetes
schemas ebb supports; an operator shapes where it goes and what it asks for; it runs as
Pod Security "restricted" asks and reads only the secrets a runner needs; and a pod's
status reads as running, ended or never starting."""

from __future__ import annotations

import kubernetes_validate
import pytest

from ebb.coldstart.k8s_pods import (
    GIB,
    PodEnd,
    PodTemplate,
    RunnerShape,
    pod_end,
    runner_pod,
    unschedulable,
)
from ebb.coldstart.placement import Placement
from ebb.config import Settings
from ebb.launching.tiers import Tier

# The oldest and newest Kubernetes versions the manifests and runner pods are checked for.
K8S_VERSIONS = ("1.25", "1.37")
TEMPLATE = PodTemplate(namespace="ebb", image="ebb:cuda", node_selector={"pool": "gpu"})
ONE_CPU = RunnerShape()
A100 = RunnerShape(gpus=1, memory_bytes=20 * GIB, accelerator="NVIDIA-A100-SXM4-80GB")
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
ZONE_TERM = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east1-b"]}
SHAPED = PodTemplate(
    namespace="ebb",
    image="ebb:cuda",
    cpu="4",
    cpu_limit="8",
    node_selector={"cloud.google.com/gke-nodepool": "gpu"},
    node_affinity={
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [ZONE_TERM]}]
        }
    },
    tolerations=(GPU_TAINT,),
    runtime_class="nvidia",
    priority_class="ebb-runners",
)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_runner_pods_validate_strictly(version):
    for pod in (
        runner_pod(
            TEMPLATE,
            "r-1",
            "m",
            Tier.FRESH,
            shape=RunnerShape(gpus=2),
            placement=Placement("n1", (0, 1)),
        ),
        runner_pod(TEMPLATE, "r-2", None, Tier.PREWARMED, shape=ONE_CPU, placement=Placement()),
        runner_pod(
            SHAPED, "r-3", None, Tier.PREWARMED, shape=A100, placement=Placement(), pool="a100"
        ),
    ):
        kubernetes_validate.validate(pod, version, strict=True)


def test_strict_validation_catches_a_misspelt_field():
    pod = runner_pod(
        TEMPLATE, "r-1", "m", Tier.FRESH, shape=RunnerShape(gpus=1), placement=Placement()
    )
    pod["spec"]["containers"][0]["resourcez"] = pod["spec"]["containers"][0].pop("resources")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSIONS[-1], strict=True)


def status(phase: str, state: dict | None = None, **extra) -> dict:
    containers = [{"name": "runner", "state": state}] if state else []
    return {"status": {"phase": phase, "containerStatuses": containers, **extra}}


def test_running_and_pending_pods_have_not_ended():
    assert pod_end(status("Pending")) is None
    assert pod_end(status("Running", {"running": {}})) is None
    assert pod_end({}) is None


def test_exits_oom_kills_evictions_and_image_pulls_end_a_runner():
    oom = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    assert pod_end(status("Failed", oom)) == PodEnd(137, "OOMKilled")
    done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    assert pod_end(status("Succeeded", done)) == PodEnd(0, "Completed")
    evicted = status("Failed", reason="Evicted", message="The node was low on memory.")
    assert pod_end(evicted) == PodEnd(-1, "Evicted: The node was low on memory.")
    pull = {"waiting": {"reason": "ErrImagePull", "message": "manifest unknown"}}
    assert pod_end(status("Pending", pull)) == PodEnd(-1, "ErrImagePull: manifest unknown")
    creating = {"waiting": {"reason": "ContainerCreating"}}
    assert pod_end(status("Pending", creating)) is None, "still on its way"


def test_an_unschedulable_pod_says_why():
    cond = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "no GPU",
    }
    assert unschedulable(status("Pending", conditions=[cond])) == "Unschedulable: no GPU"
    assert pod_end(status("Pending", conditions=[cond])) is None, "the launcher's grace decides"
    scheduled = {**cond, "status": "True"}
    assert unschedulable(status("Pending", conditions=[scheduled])) is None


def test_a_pool_stem_is_pinned_to_its_pools_nodes_beside_the_templates_selector():
    pod = runner_pod(
        TEMPLATE,
        "r-3",
        None,
        Tier.PREWARMED,
        shape=RunnerShape(gpus=1),
        placement=Placement(),
        pool="a",
    )
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu", "ebb.io/pool": "a"}
    assert pod["metadata"]["labels"]["ebb.io/pool"] == "a"
    plain = runner_pod(
        TEMPLATE, "r-4", "m", Tier.FRESH, shape=RunnerShape(gpus=1), placement=Placement()
    )
    assert plain["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert "ebb.io/pool" not in plain["metadata"]["labels"]


def container(pod: dict) -> dict:
    [c] = pod["spec"]["containers"]
    return c


def test_an_operator_shapes_where_runner_pods_go():
    pod = runner_pod(SHAPED, "r-1", "m", Tier.FRESH, shape=A100, placement=Placement("n7", (0,)))
    spec = pod["spec"]
    assert spec["tolerations"] == [GPU_TAINT]
    assert spec["runtimeClassName"] == "nvidia" and spec["priorityClassName"] == "ebb-runners"
    assert spec["nodeSelector"] == {
        "cloud.google.com/gke-nodepool": "gpu",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    }
    affinity = spec["affinity"]["nodeAffinity"]
    required = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"][0]["matchExpressions"] == [ZONE_TERM]
    [preferred] = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["preference"]["matchExpressions"][0]["values"] == ["n7"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in SHAPED.node_affinity
    assert container(pod)["resources"]["limits"]["cpu"] == "8"
    plain = runner_pod(TEMPLATE, "r-2", "m", Tier.FRESH, shape=ONE_CPU, placement=Placement())
    for absent in ("tolerations", "runtimeClassName", "priorityClassName", "affinity"):
        assert absent not in plain["spec"], absent
    assert "cpu" not in container(plain)["resources"]["limits"], "no CPU limit unless asked"


def test_memory_is_the_shapes_plus_a_dev_shm_sized_for_the_tensor_parallel_ranks():
    tp2 = RunnerShape(gpus=2, memory_bytes=30 * GIB)
    pod = runner_pod(TEMPLATE, "r-1", "m", Tier.FRESH, shape=tp2, placement=Placement())
    resources = container(pod)["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == f"{32 * 1024}Mi"
    assert resources["limits"]["nvidia.com/gpu"] == "2"
    [shm] = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{2 * 1024}Mi"}
    mounts = {m["name"]: m["mountPath"] for m in container(pod)["volumeMounts"]}
    assert mounts["dshm"] == "/dev/shm"
    stem = runner_pod(TEMPLATE, "r-2", None, Tier.PREWARMED, shape=ONE_CPU, placement=Placement())
    assert container(stem)["resources"]["limits"]["memory"] == f"{5 * 1024}Mi", "4Gi + 1Gi shm"


def test_a_runner_reads_the_config_map_and_only_the_secrets_it_needs():
    c = container(runner_pod(TEMPLATE, "r-1", "m", Tier.FRESH, shape=A100, placement=Placement()))
    assert c["envFrom"] == [{"configMapRef": {"name": "ebb-config"}}], "no whole Secret"
    from_secret = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in c["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert from_secret == {
        "EBB_REDIS_URL": {"name": "ebb-platform", "key": "EBB_REDIS_URL", "optional": False},
        "EBB_SECRETS_KEY": {"name": "ebb-platform", "key": "EBB_SECRETS_KEY", "optional": True},
    }
    with pytest.raises(ValueError, match="EBB_ADMIN_KEY"):
        PodTemplate(namespace="ebb", image="x", secret_keys=("EBB_REDIS_URL", "EBB_ADMIN_KEY"))


def test_runner_pods_meet_the_restricted_pod_security_level():
    pod = runner_pod(SHAPED, "r-1", "m", Tier.FRESH, shape=A100, placement=Placement())
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    context = container(pod)["securityContext"]
    assert context == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }
    writable = {m["mountPath"] for m in container(pod)["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in container(pod)["env"]}
    assert {"/tmp", env["HOME"], "/dev/shm"} <= writable, "a read-only root needs these"
    assert env["EBB_HOME"].startswith(env["HOME"] + "/")


def test_the_template_comes_from_the_settings(monkeypatch):
    monkeypatch.setenv(
        "EBB_K8S_RUNNER_TOLERATIONS",
        '[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]',
    )
    monkeypatch.setenv("EBB_K8S_RUNNER_NODE_SELECTOR", '{"cloud.google.com/gke-nodepool": "gpu"}')
    monkeypatch.setenv("EBB_K8S_RUNNER_RUNTIME_CLASS", "nvidia")
    monkeypatch.setenv("EBB_K8S_RUNNER_PRIORITY_CLASS", "ebb-runners")
    monkeypatch.setenv("EBB_K8S_STEM_MEMORY_BYTES", "24GiB")
    monkeypatch.setenv("EBB_K8S_RUNNER_CPU", "6")
    template = PodTemplate.from_settings(Settings())
    assert template.tolerations == (GPU_TAINT,)
    assert template.node_selector == {"cloud.google.com/gke-nodepool": "gpu"}
    assert (template.runtime_class, template.priority_class) == ("nvidia", "ebb-runners")
    assert (template.memory_bytes, template.cpu) == (24 * GIB, "6")
    assert Settings().k8s_unschedulable_timeout_s >= 15 * 60, "a GPU node takes minutes to come"
