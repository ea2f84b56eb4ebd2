"""Settings of a cluster: pre-warmed pools, the prefetcher, Kubernetes pods, Ray actors."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from ebb.config.values import bytes_or_none


class ClusterSettings(BaseModel):
    """Cluster: pre-warmed pools per node pool and the per-node weight prefetcher.

    Both launchers (Kubernetes, Ray) read these; docs/CLUSTER.md has the set-up.
    """

    stem_pools: str = Field(
        default="",
        description='Pre-warmed stems per node pool on a cluster, JSON: `{"a100": '
        '{"stems": 2, "gpus": 1}, "cpu": 1}`; replaces `EBB_PREWARM` when set. A stem of '
        "a pool lands only on nodes labelled `EBB_POOL_LABEL=<pool>` (Kubernetes) or "
        "having the resource `<pool>` (Ray).",
    )
    pool_label: str = Field(
        default="ebb.io/pool", description="The node label naming a Kubernetes node's pool."
    )
    prefetch_interval_s: float = Field(
        default=10.0,
        description="`ebb prefetch` (one per node): how often it re-reads the deployments.",
    )
    prefetch_annotate_node: bool = Field(
        default=False,
        description="`ebb prefetch` also keeps the node's `ebb.io/cached-sources` "
        "annotation (in-cluster credentials).",
    )

    @field_validator("stem_pools")
    @classmethod
    def _stem_pools_parse(cls, value: str) -> str:
        from ebb.launching.stem_pools import parse_stem_pools

        parse_stem_pools(value, prewarm=0)  # raises ValueError saying what to change
        return value


class KubernetesSettings(BaseModel):
    """Kubernetes: the runner pods the controller makes with `EBB_LAUNCHER=kubernetes`.

    A runner pod's memory (request = limit) is sized per deployment:
    `EBB_K8S_RUNNER_MEMORY_BASE_BYTES` for the process plus the weights a sleeping runner
    holds in host RAM plus its `/dev/shm`; a deployment's `engine.host_memory_gib`
    replaces the estimate.
    """

    k8s_namespace: str = Field(default="ebb", description="Runner pods' namespace.")
    k8s_runner_image: str = Field(default="ebb:cpu", description="Runner pods' image.")
    k8s_runner_template: str = Field(
        default="",
        description="A PodTemplate whose `runner` container's image replaces "
        "`EBB_K8S_RUNNER_IMAGE` (the manifests: `ebb-runner`): kustomize's `images:` "
        "rewrites it, where it would leave a ConfigMap string alone.",
    )
    k8s_platform: str = Field(default="ebb", description="Runner pods' instance label.")
    k8s_env_secret: str = Field(
        default="ebb-platform",
        description="The Secret runner pods read `EBB_REDIS_URL` and `EBB_SECRETS_KEY` "
        "from (key by key: never the admin key).",
    )
    k8s_weights_host_path: str = Field(
        default="/var/lib/ebb/weights",
        description="The node-local weight cache runner pods mount.",
    )
    k8s_gpu_resource: str = Field(
        default="nvidia.com/gpu", description="The resource a runner pod's GPUs are asked as."
    )
    k8s_gpus_per_runner: int = Field(
        default=0,
        description="The GPUs a runner pod requests and limits when its deployment's "
        "`engine.tensor_parallel_size` does not say (stems: their pool's).",
    )
    k8s_runner_cpu: str = Field(
        default="2", description="A runner pod's CPU request (a Kubernetes quantity)."
    )
    k8s_runner_cpu_limit: str = Field(
        default="", description="A runner pod's CPU limit (a Kubernetes quantity); unset: none."
    )
    k8s_runner_memory_base_bytes: int = Field(
        default=4 * 2**30,
        description="A runner pod's memory for the process (Python, torch, the engine), to "
        "which its model's weights (plus the KV cache on CPU) and its `/dev/shm` are added.",
    )
    k8s_stem_memory_bytes: int = Field(
        default=16 * 2**30,
        description="A stem pod's memory: its model is not known when the pod is made, so "
        "size it for the pool's largest model.",
    )
    k8s_runner_shm_bytes_per_gpu: int = Field(
        default=2**30,
        description="A memory-backed `/dev/shm` per GPU of a runner pod (NCCL and vLLM's "
        "workers exchange through it).",
    )
    k8s_runner_tolerations: list[dict[str, Any]] = Field(
        default=[], description="Runner pods' tolerations, JSON as in a Pod spec."
    )
    k8s_runner_node_selector: dict[str, str] = Field(
        default={}, description="Runner pods' nodeSelector, JSON as in a Pod spec."
    )
    k8s_runner_node_affinity: dict[str, Any] = Field(
        default={}, description="Runner pods' node affinity, JSON (a `nodeAffinity` object)."
    )
    k8s_runner_runtime_class: str = Field(
        default="", description="Runner pods' `runtimeClassName`; unset: the cluster's default."
    )
    k8s_runner_priority_class: str = Field(
        default="", description="Runner pods' `priorityClassName`; unset: the cluster's default."
    )
    k8s_accelerator_label: str = Field(
        default="nvidia.com/gpu.product",
        description="The node label a deployment's `engine.accelerator` must equal.",
    )
    k8s_config_map: str = Field(
        default="ebb-config",
        description="The ConfigMap whose settings (the platform's `EBB_` variables) runner "
        "pods read.",
    )
    k8s_unschedulable_timeout_s: float = Field(
        default=900.0,
        description="A runner pod no node can take fails after this long; a "
        "cluster-autoscaler scale-up for it (a `TriggeredScaleUp` event) restarts the "
        "wait: a GPU node takes minutes.",
    )

    @field_validator(
        "k8s_runner_memory_base_bytes",
        "k8s_stem_memory_bytes",
        "k8s_runner_shm_bytes_per_gpu",
        mode="before",
    )
    @classmethod
    def _parse_pod_bytes(cls, value: object, info: ValidationInfo) -> object:
        return bytes_or_none(value, info)


class RaySettings(BaseModel):
    """Ray: the cluster, and what each runner actor asks of a node, with `EBB_LAUNCHER=ray`."""

    ray_address: str = Field(default="auto", description="The Ray cluster's address.")
    ray_runner_resources: str = Field(
        default="{}",
        description='Custom resources every runner actor asks for, JSON, e.g. `{"gpu_pool_a": 1}`.',
    )
    ray_gpus_per_runner: float = Field(
        default=0,
        description="The GPUs (`num_gpus`) a runner actor asks for when its deployment's "
        "`engine.tensor_parallel_size` does not say.",
    )
