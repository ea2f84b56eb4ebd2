"""KubernetesLauncher against kmock's emulator with the official client: pods created with
the runner's labels, GPU requests, node cache and readiness; status patches standing in
for the kubelet (Pending -> Running -> Failed) reach it through the watch; failures end as
exits with the pod's events and last log lines, once; a pod no node takes ends after its
wait unless the cluster autoscaler is adding a node for it; a new launcher adopts live
pods."""

from __future__ import annotations

import json

import pytest
from support import wait_until
from support.k8s_emulator import emulator
from support.launcher_contract import check_launch_exit_once, collect

from ebb.coldstart.k8s_pods import GIB, PodTemplate, RunnerShape, pod_name
from ebb.coldstart.launch_k8s import (
    CACHED_SOURCES_ANNOTATION,
    KubernetesLauncher,
    read_runner_image,
)
from ebb.coldstart.placement import Placement, choose_placement
from ebb.launching.tiers import Tier

pytestmark = pytest.mark.integration

NS = "ebb"
TEMPLATE = PodTemplate(namespace=NS, image="ebb:test", platform="it")
LOG_PATH = f"/api/v1/namespaces/{NS}/pods/{pod_name('r-oom')}/log"


def kubelet(api, runner_id: str, status: dict) -> None:
    """Patch the pod's status as a kubelet would (container statuses complete)."""
    for c in status.get("containerStatuses", []):
        c.update(image=TEMPLATE.image, imageID="", ready="running" in c["state"], restartCount=0)
    api.patch_namespaced_pod_status(pod_name(runner_id), NS, {"status": status})


def pods_of(api, runner_id: str) -> list:
    """Label selection, done here too: the emulator ignores selectors."""
    found = api.list_namespaced_pod(NS, label_selector=f"ebb.io/runner-id={runner_id}").items
    return [p for p in found if p.metadata.labels.get("ebb.io/runner-id") == runner_id]


def running(api, runner_id: str) -> None:
    kubelet(api, runner_id, {"phase": "Pending"})
    kubelet(
        api,
        runner_id,
        {"phase": "Running", "containerStatuses": [{"name": "runner", "state": {"running": {}}}]},
    )


def terminated(api, runner_id: str, code: int, reason: str = "Error") -> None:
    state = {"terminated": {"exitCode": code, "reason": reason}}
    phase = "Succeeded" if code == 0 else "Failed"
    kubelet(
        api, runner_id, {"phase": phase, "containerStatuses": [{"name": "runner", "state": state}]}
    )


@pytest.fixture
def k8s():
    with emulator(logs={LOG_PATH: b"loading weights\nKilled\n"}) as api:
        yield api


def launcher_on(api, **kw) -> KubernetesLauncher:
    kw.setdefault("gpus_for", lambda d: 2 if d else 0)
    kw.setdefault("watch_timeout_s", 1.0)  # the emulator ignores timeout_seconds
    return KubernetesLauncher(api, TEMPLATE, **kw)


def test_a_runner_pod_goes_pending_running_failed_and_its_exit_is_reported_once(k8s):
    launcher = launcher_on(k8s)
    check_launch_exit_once(
        launcher,
        start=lambda runner_id: running(k8s, runner_id),
        end=lambda runner_id, code: terminated(k8s, runner_id, code),
    )
    wait_until(lambda: not k8s.list_namespaced_pod(NS).items, 10, "the ended pod deleted")
    launcher.stop_all(grace_s=0)


def test_the_pod_carries_gpus_node_cache_readiness_and_no_parent_tie(k8s):
    launcher = launcher_on(k8s)
    launcher.launch_on("r-gpu", "llama-70b", Tier.FRESH, Placement("gpu-node-2", (0, 1)))
    [pod] = pods_of(k8s, "r-gpu")
    c = pod.spec.containers[0]
    assert c.resources.limits["nvidia.com/gpu"] == "2" == c.resources.requests["nvidia.com/gpu"]
    assert pod.spec.restart_policy == "Never"
    assert {v.name: v.host_path.path for v in pod.spec.volumes if v.host_path} == {
        "weights": "/var/lib/ebb/weights"
    }
    env = {e.name: e.value for e in c.env}
    assert env["EBB_RUNNER_FOLLOWS_PARENT"] == "0"
    assert c.readiness_probe._exec.command == ["test", "-f", env["EBB_RUNNER_READY_FILE"]]
    assert c.args[-2:] == ["--deployment", "llama-70b"]
    preferred = pod.spec.affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
    assert preferred[0].preference.match_expressions[0].values == ["gpu-node-2"]
    launcher.launch("r-stem", None, Tier.PREWARMED)
    [stem] = pods_of(k8s, "r-stem")
    assert "nvidia.com/gpu" not in (stem.spec.containers[0].resources.requests or {})
    launcher.stop_all(grace_s=0)


def test_a_deployments_shape_reaches_its_pod_and_a_stem_keeps_the_templates(k8s):
    shapes = {"big": RunnerShape(gpus=2, memory_bytes=60 * GIB, accelerator="NVIDIA-H100")}
    launcher = launcher_on(k8s, shape_for=lambda d: shapes.get(d or "", RunnerShape()))
    launcher.launch("r-big", "big", Tier.FRESH)
    launcher.launch("r-stem", None, Tier.PREWARMED)
    [pod] = pods_of(k8s, "r-big")
    c = pod.spec.containers[0]
    assert c.resources.limits == {"memory": f"{62 * 1024}Mi", "nvidia.com/gpu": "2"}
    assert pod.spec.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100"}
    assert [f.config_map_ref.name for f in c.env_from] == ["ebb-config"]
    secrets = {e.name for e in c.env if e.value_from and e.value_from.secret_key_ref}
    assert secrets == {"EBB_REDIS_URL", "EBB_SECRETS_KEY"}
    assert pod.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    assert c.security_context.capabilities.drop == ["ALL"]
    [stem] = pods_of(k8s, "r-stem")
    assert stem.spec.containers[0].resources.limits == {"memory": f"{5 * 1024}Mi"}
    assert stem.spec.node_selector is None
    launcher.stop_all(grace_s=0)


def test_oom_kill_fails_with_the_pods_events_and_last_log_lines(k8s):
    launcher = launcher_on(k8s)
    launcher.launch("r-oom", "m", Tier.FRESH)
    running(k8s, "r-oom")
    k8s.create_namespaced_event(
        NS,
        {
            "metadata": {"name": "oom-1"},
            "involvedObject": {"kind": "Pod", "name": pod_name("r-oom")},
            "reason": "OOMKilling",
            "message": "Memory cgroup out of memory",
        },
    )
    terminated(k8s, "r-oom", 137, reason="OOMKilled")
    [exit_] = [e for e in collect(launcher, "r-oom") if e.runner_id == "r-oom"]
    assert exit_.code == 137
    assert "OOMKilled" in exit_.detail
    assert "event OOMKilling: Memory cgroup out of memory" in exit_.detail
    assert "log: Killed" in exit_.detail
    launcher.stop_all(grace_s=0)


def test_an_image_that_cannot_be_pulled_and_an_unschedulable_pod_end_as_failures(k8s):
    launcher = launcher_on(k8s, unschedulable_after_s=0)
    launcher.launch("r-image", "m", Tier.FRESH)
    launcher.launch("r-nogpu", "m", Tier.FRESH)
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": 'pull "ebb:test": not found'}}
    kubelet(
        k8s,
        "r-image",
        {"phase": "Pending", "containerStatuses": [{"name": "runner", "state": waiting}]},
    )
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    }
    kubelet(k8s, "r-nogpu", {"phase": "Pending", "conditions": [unschedulable]})
    seen = collect(launcher, "r-image")
    if not any(e.runner_id == "r-nogpu" for e in seen):
        seen += collect(launcher, "r-nogpu")
    by_id = {e.runner_id: e for e in seen}
    assert len(seen) == 2 and set(by_id) == {"r-image", "r-nogpu"}
    assert "ImagePullBackOff" in by_id["r-image"].detail
    assert "Insufficient nvidia.com/gpu" in by_id["r-nogpu"].detail
    wait_until(lambda: not k8s.list_namespaced_pod(NS).items, 10, "both pods deleted")
    launcher.stop_all(grace_s=0)


def test_a_cluster_autoscaler_scale_up_restarts_the_wait_of_an_unschedulable_pod(k8s):
    launcher = launcher_on(k8s, unschedulable_after_s=0, watch_pods=False)
    launcher.launch("r-wait", "m", Tier.FRESH)
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
    }
    kubelet(k8s, "r-wait", {"phase": "Pending", "conditions": [unschedulable]})

    def scale_up(count: int) -> None:
        event = {
            "metadata": {"name": "scale-up-1"},
            "involvedObject": {"kind": "Pod", "name": pod_name("r-wait")},
            "reason": "TriggeredScaleUp",
            "message": "pod triggered scale-up: [{gpu-pool 0->1 (max: 4)}]",
            "count": count,
        }
        if count == 1:
            k8s.create_namespaced_event(NS, event)
        else:
            k8s.patch_namespaced_event("scale-up-1", NS, {"count": count})

    scale_up(1)
    assert launcher.poll() == [], "a node is on its way: the wait starts over"
    assert launcher.alive("r-wait")
    scale_up(2)
    assert launcher.poll() == [], "the autoscaler tried again: progress too"
    [exit_] = launcher.poll()  # nothing new since: the wait is over
    assert exit_.runner_id == "r-wait" and "Insufficient nvidia.com/gpu" in exit_.detail
    assert "event TriggeredScaleUp" in exit_.detail
    launcher.stop_all(grace_s=0)


def test_a_new_leaders_launcher_adopts_live_pods_and_leaves_them_when_it_stops(k8s):
    old = launcher_on(k8s)
    old.launch("r-live", "m", Tier.FRESH)
    running(k8s, "r-live")
    old.stop_all(grace_s=0)  # a controller shutting down: runners belong to the cluster
    new = launcher_on(k8s)
    wait_until(lambda: new.alive("r-live"), 10, "the adopted pod alive")
    terminated(k8s, "r-live", 0)
    assert [e.code for e in collect(new, "r-live") if e.runner_id == "r-live"] == [0]
    owner = launcher_on(k8s, stop_runners_on_exit=True)
    owner.launch("r-owned", "m", Tier.FRESH)
    owner.stop_all(grace_s=0)
    assert not pods_of(k8s, "r-owned")
    new.stop_all(grace_s=0)


def test_another_platforms_pods_are_neither_adopted_nor_reported(k8s):
    other = KubernetesLauncher(
        k8s, PodTemplate(namespace=NS, image="x", platform="other"), watch_timeout_s=1.0
    )
    other.launch("r-theirs", "m", Tier.FRESH)
    ours = launcher_on(k8s)
    assert not ours.alive("r-theirs")
    kubelet(k8s, "r-theirs", {"phase": "Failed"})
    assert [e for e in ours.poll() if e.runner_id == "r-theirs"] == []
    ours.stop_all(grace_s=0)
    other.stop_all(grace_s=0)


def test_nodes_report_free_gpus_and_cached_weights(k8s):
    def node(name: str, gpus: int, cached: list[str], ready: str = "True") -> dict:
        return {
            "metadata": {
                "name": name,
                "annotations": {CACHED_SOURCES_ANNOTATION: json.dumps(cached)},
            },
            "status": {
                "allocatable": {"nvidia.com/gpu": str(gpus)},
                "conditions": [{"type": "Ready", "status": ready}],
            },
        }

    k8s.create_node(node("a", 4, ["s3://m/llama"]))
    k8s.create_node(node("b", 8, [], ready="False"))
    launcher = launcher_on(k8s)
    launcher.launch("r-on-a", "llama", Tier.FRESH)
    k8s.patch_namespaced_pod(pod_name("r-on-a"), NS, {"spec": {"nodeName": "a"}})
    wait_until(
        lambda: {n.name: n.free_gpus for n in launcher.nodes()} == {"a": 2, "b": 8},
        10,
        "GPUs in use on node a",
    )
    nodes = {n.name: n for n in launcher.nodes()}
    assert nodes["a"].cached_sources == frozenset({"s3://m/llama"}) and nodes["a"].schedulable
    assert not nodes["b"].schedulable
    # The plan's choice from these nodes: the next llama runner prefers the node holding
    # its weights.
    chosen = choose_placement(launcher.nodes(), "s3://m/llama", 2)
    assert chosen == Placement("a", (0, 1))
    launcher.launch_on("r-next", "llama", Tier.FRESH, chosen)
    [pod] = pods_of(k8s, "r-next")
    preferred = pod.spec.affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
    assert preferred[0].preference.match_expressions[0].values == ["a"]
    launcher.stop_all(grace_s=0)


def test_the_runner_image_is_read_from_the_clusters_pod_template(k8s):
    template = {
        "metadata": {"name": "ebb-runner"},
        "template": {
            "spec": {"containers": [{"name": "runner", "image": "registry.example.com/ebb:cuda-2"}]}
        },
    }
    k8s.create_namespaced_pod_template(NS, template)
    assert read_runner_image(k8s, NS, "ebb-runner") == "registry.example.com/ebb:cuda-2"
    k8s.create_namespaced_pod_template(
        NS,
        {
            "metadata": {"name": "empty"},
            "template": {"spec": {"containers": [{"name": "x", "image": "y"}]}},
        },
    )
    with pytest.raises(ValueError, match="no container named 'runner'"):
        read_runner_image(k8s, NS, "empty")
