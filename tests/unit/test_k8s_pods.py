"""Runner pods as data: the Pod validates (strict) against the oldest and newest Kubernetes
schemas ebb supports, and a pod's status reads as running, ended or never starting."""

from __future__ import annotations

import kubernetes_validate
import pytest

from ebb.coldstart.k8s_pods import PodEnd, PodTemplate, pod_end, runner_pod, unschedulable
from ebb.coldstart.placement import Placement
from ebb.coldstart.tiers import Tier

# The oldest and newest Kubernetes versions the manifests and runner pods are checked for.
K8S_VERSIONS = ("1.25", "1.37")
TEMPLATE = PodTemplate(namespace="ebb", image="ebb:cuda", node_selector={"pool": "gpu"})


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_runner_pods_validate_strictly(version):
    for pod in (
        runner_pod(TEMPLATE, "r-1", "m", Tier.FRESH, gpus=2, placement=Placement("n1", (0, 1))),
        runner_pod(TEMPLATE, "r-2", None, Tier.PREWARMED, gpus=0, placement=Placement()),
        runner_pod(
            TEMPLATE, "r-3", None, Tier.PREWARMED, gpus=1, placement=Placement(), pool="a100"
        ),
    ):
        kubernetes_validate.validate(pod, version, strict=True)


def test_strict_validation_catches_a_misspelt_field():
    pod = runner_pod(TEMPLATE, "r-1", "m", Tier.FRESH, gpus=1, placement=Placement())
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
    pod = runner_pod(TEMPLATE, "r-3", None, Tier.PREWARMED, gpus=1, placement=Placement(), pool="a")
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu", "ebb.io/pool": "a"}
    assert pod["metadata"]["labels"]["ebb.io/pool"] == "a"
    plain = runner_pod(TEMPLATE, "r-4", "m", Tier.FRESH, gpus=1, placement=Placement())
    assert plain["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert "ebb.io/pool" not in plain["metadata"]["labels"]
