"""Runner pods as data: the Pod a runner runs in, and what a pod's status says of it.

Pure functions over plain dicts (the shape the API server speaks), so they are tested
without a cluster and `launch_k8s.KubernetesLauncher` only moves them to and from the API.

A runner pod runs `python -m ebb runner` once (restartPolicy Never: an exit is final, the
controller launches another). It does not follow a parent (EBB_RUNNER_FOLLOWS_PARENT=0):
its heartbeat in Redis is its liveness. It is ready while the runner's own state is READY
(the runner keeps a file for that: EBB_RUNNER_READY_FILE). Its weights cache is the node's
(a hostPath), so a second runner of a model on the same node finds the weights there.

Its environment is the platform's ConfigMap, its own variables, and from the platform
Secret only the keys a runner needs (`RUNNER_SECRET_KEYS`): it reads tenant input, so the
admin key never reaches it. It runs as the "restricted" Pod Security level asks (non-root,
no capabilities, RuntimeDefault seccomp, a read-only root with writable emptyDirs for
/tmp, HOME and a memory-backed /dev/shm sized for its tensor-parallel ranks).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

from ebb.coldstart.placement import Placement
from ebb.config import Settings
from ebb.gpus.count import HELD_GPUS_ENV
from ebb.launching.tiers import Tier

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


MIB = 2**20
GIB = 2**30
UID = 10001  # the images' ebb user
HOME = "/home/ebb"  # writable (an emptyDir): the root filesystem is read-only
# The platform secrets a runner reads (its Redis, the key that opens its version's env);
# never the admin key, the metrics token or an API key: a runner reads tenant input.
RUNNER_SECRET_KEYS = ("EBB_REDIS_URL", "EBB_SECRETS_KEY")
FORBIDDEN_RUNNER_SECRETS = frozenset({"EBB_ADMIN_KEY", "EBB_METRICS_TOKEN", "EBB_API_KEY"})
# The policy checks (checkov) a runner pod does not meet, each with its reason, on the
# pod itself: a platform team scanning the cluster reads why.
POLICY_SKIPS = {
    "CKV_K8S_8": "a runner's liveness is its heartbeat in Redis: the controller ends a "
    "runner whose heartbeat stops",
    "CKV_K8S_15": "IfNotPresent: a node pulls the multi-GB runner image once",
    "CKV_K8S_35": "ebb reads settings from the environment; only EBB_REDIS_URL and "
    "EBB_SECRETS_KEY come from the Secret",
    "CKV_K8S_43": "the runner image is the operator's (EBB_K8S_RUNNER_TEMPLATE): pin a "
    "digest there",
}
NO_CPU_LIMIT_SKIP = (
    "CKV_K8S_11",
    "no CPU limit unless EBB_K8S_RUNNER_CPU_LIMIT: "
    "throttling slows every request; the CPU request reserves what it needs",
)


@dataclass(frozen=True)
class PodTemplate:
    """What every runner pod of one platform shares (`from_settings`: the EBB_K8S_ ones)."""

    namespace: str
    image: str
    platform: str = "ebb"  # the instance label: several platforms may share a namespace
    # The Secret holding EBB_REDIS_URL and EBB_SECRETS_KEY: runners read those keys only.
    env_secret: str = "ebb-platform"
    secret_keys: tuple[str, ...] = RUNNER_SECRET_KEYS
    # The ConfigMap of the platform's settings (EBB_ variables), read whole as environment.
    config_map: str = "ebb-config"
    weights_host_path: str = "/var/lib/ebb/weights"
    gpu_resource: str = "nvidia.com/gpu"
    cpu: str = "1"
    cpu_limit: str = ""  # "": no CPU limit (throttling a runner slows every request)
    # A pod's memory when its shape does not say (a stem: its model is not known yet).
    memory_bytes: int = 4 * GIB
    shm_bytes_per_gpu: int = GIB
    drain_grace_s: int = 60
    node_selector: dict[str, str] = field(default_factory=dict)
    node_affinity: dict[str, Any] = field(default_factory=dict)  # a nodeAffinity object
    tolerations: tuple[dict[str, Any], ...] = ()
    runtime_class: str = ""
    priority_class: str = ""
    # The node label naming a node's pool: a stem of pool P runs only where it says P.
    pool_label: str = "ebb.io/pool"
    # The node label a shape's accelerator must equal (the GPU feature discovery's).
    accelerator_label: str = "nvidia.com/gpu.product"

    def __post_init__(self) -> None:
        leaked = FORBIDDEN_RUNNER_SECRETS & set(self.secret_keys)
        if leaked:
            raise ValueError(f"runner pods must not read {sorted(leaked)}")

    @classmethod
    def from_settings(cls, settings: Settings) -> PodTemplate:
        return cls(
            namespace=settings.k8s_namespace,
            image=settings.k8s_runner_image,
            platform=settings.k8s_platform,
            env_secret=settings.k8s_env_secret,
            config_map=settings.k8s_config_map,
            weights_host_path=settings.k8s_weights_host_path,
            gpu_resource=settings.k8s_gpu_resource,
            cpu=settings.k8s_runner_cpu,
            cpu_limit=settings.k8s_runner_cpu_limit,
            memory_bytes=settings.k8s_stem_memory_bytes,
            shm_bytes_per_gpu=settings.k8s_runner_shm_bytes_per_gpu,
            node_selector=dict(settings.k8s_runner_node_selector),
            node_affinity=dict(settings.k8s_runner_node_affinity),
            tolerations=tuple(settings.k8s_runner_tolerations),
            runtime_class=settings.k8s_runner_runtime_class,
            priority_class=settings.k8s_runner_priority_class,
            pool_label=settings.pool_label,
            accelerator_label=settings.k8s_accelerator_label,
        )


@dataclass(frozen=True)
class RunnerShape:
    """What one runner pod asks of its node: its deployment's, or a stem's."""

    gpus: int = 0
    # The process's memory, /dev/shm excluded; None: the template's `memory_bytes`.
    memory_bytes: int | None = None
    accelerator: str = ""  # a value of the template's accelerator label; "": any node


def runner_image_of(pod_template: dict[str, Any]) -> str:
    """The image of the "runner" container of a PodTemplate object (infra/base/runner.yaml);
    ValueError when it has none."""
    spec = ((pod_template.get("template") or {}).get("spec")) or {}
    for c in spec.get("containers") or []:
        if c.get("name") == "runner" and c.get("image"):
            return str(c["image"])
    name = (pod_template.get("metadata") or {}).get("name")
    raise ValueError(f"PodTemplate {name!r} has no container named 'runner' with an image")


def pod_name(runner_id: str) -> str:
    return f"ebb-runner-{runner_id}"


def platform_selector(template: PodTemplate) -> str:
    return f"{LABEL_APP}={RUNNER_APP},{LABEL_PLATFORM}={template.platform}"


def shm_bytes(template: PodTemplate, gpus: int) -> int:
    """The in-memory /dev/shm: NCCL's and vLLM's worker queues grow with the ranks."""
    return template.shm_bytes_per_gpu * max(1, gpus)


def quantity(nbytes: int) -> str:
    """Bytes as a Kubernetes quantity, rounded up to whole MiB."""
    return f"{-(-nbytes // MIB)}Mi"


def runner_pod(
    template: PodTemplate,
    runner_id: str,
    deployment: str | None,
    tier: Tier,
    *,
    shape: RunnerShape,
    placement: Placement,
    pool: str = "",
    launched_ms: int | None = None,
) -> dict[str, Any]:
    """The Pod for one runner; `placement.node`, when set, is preferred, not required
    (the scheduler may still place it elsewhere rather than leave it pending). A stem of
    a node `pool` is required on that pool's nodes (`template.pool_label`), a shape's
    accelerator on nodes whose `template.accelerator_label` names it."""
    args = ["-m", "ebb", "runner", "--runner-id", runner_id, "--tier", str(tier)]
    if deployment is not None:
        args += ["--deployment", deployment]
    shm = shm_bytes(template, shape.gpus)
    launched = int(time.time() * 1000) if launched_ms is None else launched_ms
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # runners never talk to the API server
        "enableServiceLinks": False,  # no other Service's address in the environment
        "terminationGracePeriodSeconds": template.drain_grace_s,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "runner",
                "image": template.image,
                "command": ["python"],
                "args": args,
                "env": _env(template, launched, shape.gpus),
                "envFrom": [{"configMapRef": {"name": template.config_map}}],
                "resources": _resources(template, shape, shm),
                "readinessProbe": {
                    "exec": {"command": ["test", "-f", READY_FILE]},
                    "periodSeconds": 1,
                },
                "volumeMounts": [
                    {"name": "weights", "mountPath": WEIGHTS_MOUNT},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "home", "mountPath": HOME},
                    {"name": "dshm", "mountPath": "/dev/shm"},
                ],
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    "readOnlyRootFilesystem": True,
                    "runAsNonRoot": True,
                },
            }
        ],
        "volumes": [
            {
                "name": "weights",
                "hostPath": {"path": template.weights_host_path, "type": "DirectoryOrCreate"},
            },
            {"name": "tmp", "emptyDir": {}},
            {"name": "home", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": quantity(shm)}},
        ],
    }
    _place(spec, template, shape, placement, pool)
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
            "annotations": {
                ANNOTATION_DEPLOYMENT: deployment or "",
                **_policy_skips(template),
            },
        },
        "spec": spec,
    }


def _policy_skips(template: PodTemplate) -> dict[str, str]:
    skips = dict(POLICY_SKIPS)
    if not template.cpu_limit:
        skips.update([NO_CPU_LIMIT_SKIP])
    return {
        f"checkov.io/skip{i}": f"{check}={why}"
        for i, (check, why) in enumerate(sorted(skips.items()), 1)
    }


def _env(template: PodTemplate, launched_ms: int, gpus: int) -> list[dict[str, Any]]:
    """The pod's own variables (they win over the ConfigMap's) and, key by key, the
    platform secrets a runner needs; EBB_REDIS_URL must exist, the others may not. A pod
    asking for GPUs names how many, which is what its runner is billed for."""
    env: list[dict[str, Any]] = [
        {"name": "EBB_RUNNER_FOLLOWS_PARENT", "value": "0"},
        {"name": "EBB_RUNNER_READY_FILE", "value": READY_FILE},
        {"name": "EBB_WEIGHTS_CACHE_DIR", "value": WEIGHTS_MOUNT},
        {"name": "EBB_RUNNER_LAUNCHED_MS", "value": str(launched_ms)},
        {"name": "HOME", "value": HOME},
        {"name": "EBB_HOME", "value": f"{HOME}/.ebb"},
        {"name": "EBB_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    if gpus:
        env.append({"name": HELD_GPUS_ENV, "value": str(gpus)})
    for key in template.secret_keys:
        ref = {"name": template.env_secret, "key": key, "optional": key != "EBB_REDIS_URL"}
        env.append({"name": key, "valueFrom": {"secretKeyRef": ref}})
    return env


def _resources(template: PodTemplate, shape: RunnerShape, shm: int) -> dict[str, Any]:
    """Memory request = limit (a runner's weights are not reclaimable), /dev/shm counted
    in it (a memory-backed emptyDir is charged to the pod)."""
    memory = quantity(
        (template.memory_bytes if shape.memory_bytes is None else shape.memory_bytes) + shm
    )
    requests: dict[str, str] = {"cpu": template.cpu, "memory": memory}
    limits: dict[str, str] = {"memory": memory}
    if template.cpu_limit:
        limits["cpu"] = template.cpu_limit
    if shape.gpus:
        requests[template.gpu_resource] = limits[template.gpu_resource] = str(shape.gpus)
    return {"requests": requests, "limits": limits}


def _place(
    spec: dict[str, Any],
    template: PodTemplate,
    shape: RunnerShape,
    placement: Placement,
    pool: str,
) -> None:
    """Where the pod may go: the template's selector, tolerations, affinity and classes,
    the pool's and the accelerator's node labels, placement's preferred node."""
    selector = dict(template.node_selector)
    if pool:
        selector[template.pool_label] = pool
    if shape.accelerator:
        selector[template.accelerator_label] = shape.accelerator
    if selector:
        spec["nodeSelector"] = selector
    if template.tolerations:
        spec["tolerations"] = [dict(t) for t in template.tolerations]
    node_affinity = copy.deepcopy(template.node_affinity)
    if placement.node:
        preferred = node_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
        preferred.append(_prefer_node(placement.node))
    if node_affinity:
        spec["affinity"] = {"nodeAffinity": node_affinity}
    if template.runtime_class:
        spec["runtimeClassName"] = template.runtime_class
    if template.priority_class:
        spec["priorityClassName"] = template.priority_class


def _prefer_node(node: str) -> dict[str, Any]:
    term = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
    return {"weight": 100, "preference": {"matchExpressions": [term]}}


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
