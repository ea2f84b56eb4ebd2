"""infra/: every overlay renders offline (`kubectl kustomize`) and validates strictly
against the oldest and newest Kubernetes versions ebb supports; and what the manifests
promise holds: the controller's RBAC is exactly the launcher's verbs, only the frontdoor
takes outside connections and nothing dials the metadata endpoint, a leader and a standby,
Redis with AOF on a volume and a maxmemory, a weight prefetcher on every node (GPU nodes
too) filling the cache runner pods mount, every pod as Pod Security "restricted" asks,
the runner image where kustomize's `images:` reaches it, and no default-pool stems on a
GPU cluster."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from test_k8s_pods import K8S_VERSIONS

INFRA = Path(__file__).resolve().parents[2] / "infra"
OVERLAYS = ("cpu", "cuda", "external-redis")


def render(overlay: str | Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl renders the manifests (kustomize, offline); it is in the image"
    where = overlay if isinstance(overlay, Path) else INFRA / "overlays" / overlay
    out = subprocess.run(
        [kubectl, "kustomize", str(where)],
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
        ("podtemplates", "get"),
    }
    [template_rule] = [r for r in rules if r["resources"] == ["podtemplates"]]
    assert template_rule["resourceNames"] == ["ebb-runner"], "the runner image's, no other"
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
    [container] = redis["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction", "never evict a queue"
    maxmemory_mib = int(args[args.index("--maxmemory") + 1].removesuffix("mb"))
    assert maxmemory_mib < int(container["resources"]["limits"]["memory"].removesuffix("Gi")) * 1024
    assert redis["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert "ebb-redis" not in by_kind(render("external-redis"), "StatefulSet")


def runner_image(docs: list[dict]) -> str:
    config = by_kind(docs, "ConfigMap")["ebb-config"]["data"]
    template = by_kind(docs, "PodTemplate")[config["EBB_K8S_RUNNER_TEMPLATE"]]
    [runner] = template["template"]["spec"]["containers"]
    return str(runner["image"])


def test_the_cuda_overlay_runs_gpu_runners_from_the_cuda_image_and_the_rest_on_cpu():
    docs = render("cuda")
    config = by_kind(docs, "ConfigMap")["ebb-config"]["data"]
    assert config["EBB_K8S_GPUS_PER_RUNNER"] == "1" and runner_image(docs) == "ebb-runner:cuda"
    images = {
        c["image"]
        for d in by_kind(docs, "Deployment").values()
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"ebb:cpu"}
    assert runner_image(render("cpu")) == "ebb-runner:cpu"
    # A stem of the default pool may land on a node without GPUs and then be handed a GPU
    # deployment: a GPU cluster pre-warms per pool (EBB_STEM_POOLS) only.
    assert config["EBB_PREWARM"] == "0"
    tolerations = json.loads(config["EBB_K8S_RUNNER_TOLERATIONS"])
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations


def test_kustomize_set_image_moves_the_runner_image_too(tmp_path):
    """What an operator's overlay does (`kustomize edit set image`): the runner image is a
    container image kustomize rewrites, not a ConfigMap string it leaves alone."""
    base = os.path.relpath(INFRA / "overlays" / "cuda", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"resources: [{base}]\n"
        "images:\n"
        "  - {name: ebb, newName: registry.example.com/ebb, newTag: cpu-1.4}\n"
        "  - {name: ebb-runner, newName: registry.example.com/ebb, newTag: cuda-1.4}\n"
        "patches:\n"
        "  - target: {kind: PersistentVolumeClaim, name: ebb-weights}\n"
        "    patch: |-\n"
        "      - {op: add, path: /spec/storageClassName, value: standard-rwx}\n"
    )
    docs = render(tmp_path)
    assert runner_image(docs) == "registry.example.com/ebb:cuda-1.4"
    frontdoor = by_kind(docs, "Deployment")["ebb-frontdoor"]["spec"]["template"]["spec"]
    assert frontdoor["containers"][0]["image"] == "registry.example.com/ebb:cpu-1.4"
    claim = by_kind(docs, "PersistentVolumeClaim")["ebb-weights"]["spec"]
    assert claim["storageClassName"] == "standard-rwx", "docs/CLUSTER.md's storage class step"


WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_runs_as_the_restricted_pod_security_level_asks(overlay):
    docs = render(overlay)
    pods = {
        f"{d['kind']}/{name}": (d["template"] if kind == "PodTemplate" else d["spec"]["template"])[
            "spec"
        ]
        for kind in (*WORKLOADS, "PodTemplate")
        for name, d in by_kind(docs, kind).items()
    }
    assert len(pods) >= 6
    for name, pod in pods.items():
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for c in pod.get("initContainers", []) + pod["containers"]:
            where = f"{name}/{c['name']}"
            context = c["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            assert context["readOnlyRootFilesystem"] is True, where
            if where == "DaemonSet/ebb-prefetcher/own-cache":
                # The one root container: it chowns the node's cache and does nothing else.
                assert context["capabilities"]["add"] == ["CHOWN"] and c["command"][0] == "chown"
                continue
            non_root = context.get("runAsNonRoot", pod["securityContext"].get("runAsNonRoot"))
            assert non_root is True, where
            assert context.get("runAsUser", pod["securityContext"].get("runAsUser")) >= 10000


def test_no_pod_reaches_the_cloud_metadata_endpoint():
    egress = by_kind(render("cpu"), "NetworkPolicy")["ebb-egress-no-metadata"]["spec"]
    assert egress["podSelector"] == {} and egress["policyTypes"] == ["Egress"]
    blocks = [peer["ipBlock"] for rule in egress["egress"] for peer in rule["to"]]
    assert {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]} in blocks
    assert all(b["except"] for b in blocks), "every allowed range carves the endpoint out"


def test_frontdoors_spread_drain_and_scale():
    docs = render("cpu")
    spec = by_kind(docs, "Deployment")["ebb-frontdoor"]["spec"]["template"]["spec"]
    keys = {t["topologyKey"] for t in spec["topologySpreadConstraints"]}
    assert keys == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    pre_stop = spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep" and int(pre_stop[1]) < spec["terminationGracePeriodSeconds"]
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    drain_s = int(env["EBB_FRONTDOOR_DRAIN_S"])
    assert drain_s > 0, "a rolling restart lets streams finish"
    # Kubernetes kills the pod this long after it began stopping: preStop, then the drain.
    assert int(pre_stop[1]) + drain_s < spec["terminationGracePeriodSeconds"]
    hpa = by_kind(docs, "HorizontalPodAutoscaler")["ebb-frontdoor"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "ebb-frontdoor" and hpa["minReplicas"] >= 2


def test_the_controller_has_room_for_a_conversion():
    controller = by_kind(render("cpu"), "Deployment")["ebb-controller"]
    [c] = controller["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["memory"] == "4Gi", "as the prefetcher's, which converts too"


def test_a_prefetcher_per_node_fills_the_cache_runner_pods_mount_and_only_annotates_nodes():
    docs = render("cpu")
    config = by_kind(docs, "ConfigMap")["ebb-config"]["data"]
    daemon = by_kind(docs, "DaemonSet")["ebb-prefetcher"]["spec"]["template"]["spec"]
    [container] = daemon["containers"]
    assert container["command"] == ["python", "-m", "ebb", "prefetch"]
    env = {e["name"]: e for e in container["env"]}
    assert env["EBB_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["EBB_PREFETCH_ANNOTATE_NODE"]["value"] == "1"
    assert env["EBB_WEIGHTS_CACHE_BYTES"]["value"], "a budget per node"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in daemon[
        "tolerations"
    ], "runners' nodes are GPU nodes"
    [own] = daemon["initContainers"]
    assert own["command"] == ["chown", "10001:10001", config["EBB_WEIGHTS_CACHE_DIR"]]
    [cache] = [v for v in daemon["volumes"] if "hostPath" in v]
    assert cache["hostPath"]["path"] == config["EBB_K8S_WEIGHTS_HOST_PATH"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[cache["name"]] == config["EBB_WEIGHTS_CACHE_DIR"]
    [rule] = by_kind(docs, "ClusterRole")["ebb-annotate-nodes"]["rules"]
    assert (rule["resources"], sorted(rule["verbs"])) == (["nodes"], ["get", "patch"])
    binding = by_kind(docs, "ClusterRoleBinding")["ebb-prefetcher-annotate-nodes"]
    assert binding["subjects"][0]["name"] == daemon["serviceAccountName"]
