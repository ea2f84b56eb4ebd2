"""infra/: every overlay renders offline (`kubectl kustomize`) and validates strictly
against the oldest and newest Kubernetes versions ebb supports; and what the manifests
promise holds: the controller's RBAC is exactly the launcher's verbs, only the frontdoor
takes outside connections, a leader and a standby, Redis with AOF on a volume, a weight
prefetcher on every node filling the cache runner pods mount."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from test_k8s_pods import K8S_VERSIONS

INFRA = Path(__file__).resolve().parents[2] / "infra"
OVERLAYS = ("cpu", "cuda", "external-redis")


def render(overlay: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl renders the manifests (kustomize, offline); it is in the image"
    out = subprocess.run(
        [kubectl, "kustomize", str(INFRA / "overlays" / overlay)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_overlay_renders_and_validates_strictly(overlay, version):
    docs = render(overlay)
    assert len(docs) >= 15
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {path}: {e}") from e
    for doc in docs:
        if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"].get("namespace") == "ebb", doc["metadata"]["name"]


def test_the_controllers_rbac_is_the_launchers_verbs_and_nothing_more():
    docs = render("cpu")
    rules = by_kind(docs, "Role")["ebb-runner-pods"]["rules"]
    granted = {(r, v) for rule in rules for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {
        ("pods", "create"),
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "watch"),
        ("pods", "delete"),
        ("pods/log", "get"),
        ("events", "list"),
    }
    [node_rule] = by_kind(docs, "ClusterRole")["ebb-read-nodes"]["rules"]
    assert (node_rule["resources"], node_rule["verbs"]) == (["nodes"], ["list"])
    for name, deployment in by_kind(docs, "Deployment").items():
        spec = deployment["spec"]["template"]["spec"]
        if name != "ebb-controller":
            assert spec["automountServiceAccountToken"] is False, name


def test_only_the_frontdoor_takes_connections_from_outside():
    policies = by_kind(render("cpu"), "NetworkPolicy")
    deny = policies["ebb-default-deny-ingress"]["spec"]
    assert (
        deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"] and "ingress" not in deny
    )
    open_to_all = [
        name
        for name, p in policies.items()
        for rule in p["spec"].get("ingress", [])
        if "from" not in rule
    ]
    assert open_to_all == ["ebb-frontdoor-ingress"]
    redis = policies["ebb-redis-from-ebb"]["spec"]
    assert all("podSelector" in peer for peer in redis["ingress"][0]["from"]), "ebb's pods only"


def test_a_leader_and_a_standby_redis_with_aof_on_a_volume_and_a_frontdoor_budget():
    docs = render("cpu")
    deployments = by_kind(docs, "Deployment")
    assert deployments["ebb-controller"]["spec"]["replicas"] == 2
    assert by_kind(docs, "PodDisruptionBudget")["ebb-frontdoor"]["spec"]["minAvailable"] == 2
    redis = by_kind(docs, "StatefulSet")["ebb-redis"]["spec"]
    args = redis["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert redis["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert "ebb-redis" not in by_kind(render("external-redis"), "StatefulSet")


def test_the_cuda_overlay_runs_gpu_runners_from_the_cuda_image():
    docs = render("cuda")
    config = by_kind(docs, "ConfigMap")["ebb-config"]["data"]
    assert config["EBB_K8S_GPUS_PER_RUNNER"] == "1" and config["EBB_K8S_RUNNER_IMAGE"] == "ebb:cuda"
    images = {
        c["image"]
        for d in by_kind(docs, "Deployment").values()
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"ebb:cuda"}


def test_a_prefetcher_per_node_fills_the_cache_runner_pods_mount_and_only_annotates_nodes():
    docs = render("cpu")
    config = by_kind(docs, "ConfigMap")["ebb-config"]["data"]
    daemon = by_kind(docs, "DaemonSet")["ebb-prefetcher"]["spec"]["template"]["spec"]
    [container] = daemon["containers"]
    assert container["command"] == ["python", "-m", "ebb", "prefetch"]
    env = {e["name"]: e for e in container["env"]}
    assert env["EBB_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["EBB_PREFETCH_ANNOTATE_NODE"]["value"] == "1"
    [cache] = [v for v in daemon["volumes"] if "hostPath" in v]
    assert cache["hostPath"]["path"] == config["EBB_K8S_WEIGHTS_HOST_PATH"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[cache["name"]] == config["EBB_WEIGHTS_CACHE_DIR"]
    [rule] = by_kind(docs, "ClusterRole")["ebb-annotate-nodes"]["rules"]
    assert (rule["resources"], sorted(rule["verbs"])) == (["nodes"], ["get", "patch"])
    binding = by_kind(docs, "ClusterRoleBinding")["ebb-prefetcher-annotate-nodes"]
    assert binding["subjects"][0]["name"] == daemon["serviceAccountName"]
