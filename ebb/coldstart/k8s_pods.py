"""Runner pods as data: the Pod a runner runs in, and what a pod's status says of it.

Pure functions over plain dicts (the shape the API server speaks), so they are tested
without a cluster and `launch_k8s.KubernetesLauncher` only moves them to and from the API.

A runner pod runs `python -m ebb runner` once (restartPolicy Never: an exit is final, the
controller launches another). It does not follow a parent (EBB_RUNNER_FOLLOWS_PARENT=0):
its heartbeat in Redis is its liveness. It is ready while the runner's own state is READY
(the runner keeps a file for that: EBB_RUNNER_READY_FILE). Its weights cache is the node's
(a hostPath), so a second runner of a model on the same node finds the weights there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ebb.coldstart.placement import Placement
from ebb.coldstart.tiers import Tier

RUNNER_APP = "ebb-runner"
LABEL_APP = "app.kubernetes.io/name"
LABEL_PLATFORM = "app.kubernetes.io/instance"
LABEL_RUNNER = "ebb.io/runner-id"
LABEL_TIER = "ebb.io/tier"
LABEL_POOL = "ebb.io/pool"  # on a stem pod: the node pool it waits in
ANNOTATION_DEPLOYMENT = "ebb.io/deployment"  # names are not all valid label values
# Node annotation a node's prefetcher keeps (`ebb prefetch`): JSON list of cached sources.
CACHED_SOURCES_ANNOTATION = "ebb.io/cached-sources"
WEIGHTS_MOUNT = "/var/lib/ebb/weights"
READY_FILE = "/tmp/ebb/ready"

# Container states that never end on their own: the pod will not start as it is.
_STUCK_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)


@dataclass(frozen=True)
class PodTemplate:
    """What every runner pod of one platform shares (from Settings, see `from_settings`)."""

    namespace: str
    image: str
    platform: str = "ebb"  # the instance label: several platforms may share a namespace
    # A Secret with EBB_REDIS_URL, EBB_ADMIN_KEY and the like, read as environment.
    env_secret: str = "ebb-platform"
    weights_host_path: str = "/var/lib/ebb/weights"
    gpu_resource: str = "nvidia.com/gpu"
    cpu: str = "1"
    memory: str = "4Gi"
    drain_grace_s: int = 60
    node_selector: dict[str, str] = field(default_factory=dict)
    # The node label naming a node's pool: a stem of pool P runs only where it says P.
    pool_label: str = "ebb.io/pool"


def pod_name(runner_id: str) -> str:
    return f"ebb-runner-{runner_id}"


def platform_selector(template: PodTemplate) -> str:
    return f"{LABEL_APP}={RUNNER_APP},{LABEL_PLATFORM}={template.platform}"


def runner_pod(
    template: PodTemplate,
    runner_id: str,
    deployment: str | None,
    tier: Tier,
    *,
    gpus: int,
    placement: Placement,
    pool: str = "",
) -> dict[str, Any]:
    """The Pod for one runner; `placement.node`, when set, is preferred, not required
    (the scheduler may still place it elsewhere rather than leave it pending). A stem of
    a node `pool` is required on that pool's nodes (`template.pool_label`)."""
    args = ["-m", "ebb", "runner", "--runner-id", runner_id, "--tier", str(tier)]
    if deployment is not None:
        args += ["--deployment", deployment]
    resources: dict[str, Any] = {"requests": {"cpu": template.cpu, "memory": template.memory}}
    resources["limits"] = {"memory": template.memory}
    if gpus:
        resources["requests"][template.gpu_resource] = str(gpus)
        resources["limits"][template.gpu_resource] = str(gpus)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # runners never talk to the API server
        "terminationGracePeriodSeconds": template.drain_grace_s,
        "containers": [
            {
                "name": "runner",
                "image": template.image,
                "command": ["python"],
                "args": args,
                "env": [
                    {"name": "EBB_RUNNER_FOLLOWS_PARENT", "value": "0"},
                    {"name": "EBB_RUNNER_READY_FILE", "value": READY_FILE},
                    {"name": "EBB_WEIGHTS_CACHE_DIR", "value": WEIGHTS_MOUNT},
                    {"name": "EBB_RUNNER_LAUNCHED_MS", "value": str(int(time.time() * 1000))},
                    {
                        "name": "EBB_NODE_NAME",
                        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                    },
                ],
                "envFrom": [{"secretRef": {"name": template.env_secret}}],
                "resources": resources,
                "readinessProbe": {
                    "exec": {"command": ["test", "-f", READY_FILE]},
                    "periodSeconds": 1,
                },
                "volumeMounts": [
                    {"name": "weights", "mountPath": WEIGHTS_MOUNT},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
                "securityContext": {"allowPrivilegeEscalation": False},
            }
        ],
        "volumes": [
            {
                "name": "weights",
                "hostPath": {"path": template.weights_host_path, "type": "DirectoryOrCreate"},
            },
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    selector = dict(template.node_selector)
    if pool:
        selector[template.pool_label] = pool
    if selector:
        spec["nodeSelector"] = selector
    if placement.node:
        spec["affinity"] = _prefer_node(placement.node)
    labels = {
        LABEL_APP: RUNNER_APP,
        LABEL_PLATFORM: template.platform,
        LABEL_RUNNER: runner_id,
        LABEL_TIER: str(tier),
    }
    if pool:
        labels[LABEL_POOL] = pool
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(runner_id),
            "namespace": template.namespace,
            "labels": labels,
            "annotations": {ANNOTATION_DEPLOYMENT: deployment or ""},
        },
        "spec": spec,
    }


def _prefer_node(node: str) -> dict[str, Any]:
    term = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": [term]}}
            ]
        }
    }


@dataclass(frozen=True)
class PodEnd:
    """A runner pod that is over, or will never start: the exit code and why."""

    code: int
    reason: str


def pod_end(pod: dict[str, Any]) -> PodEnd | None:
    """None while the pod runs or may still start; else how it ended (a container that
    exited, a pod that failed or was evicted, an image that cannot be pulled)."""
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    for c in status.get("containerStatuses") or []:
        state = c.get("state") or {}
        terminated = state.get("terminated")
        if terminated and phase in ("Succeeded", "Failed"):
            return PodEnd(
                int(terminated.get("exitCode", -1)),
                _why(terminated.get("reason") or "Error", terminated.get("message")),
            )
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in _STUCK_WAITING:
            return PodEnd(-1, _why(waiting["reason"], waiting.get("message")))
    if phase == "Succeeded":
        return PodEnd(0, "Completed")
    if phase == "Failed":  # Evicted, NodeLost, ... before or without a container status
        return PodEnd(-1, _why(status.get("reason") or "Failed", status.get("message")))
    return None


def unschedulable(pod: dict[str, Any]) -> str | None:
    """The scheduler's message while it cannot place the pod (no node has the GPUs)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        scheduled = (cond.get("type"), cond.get("status"), cond.get("reason"))
        if scheduled == ("PodScheduled", "False", "Unschedulable"):
            return _why("Unschedulable", cond.get("message"))
    return None


def _why(reason: str, message: object) -> str:
    return f"{reason}: {message}" if message else reason


def runner_id_of(pod: dict[str, Any]) -> str | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    value = labels.get(LABEL_RUNNER)
    return value if isinstance(value, str) else None
