"""Settings of serving: runners, the controller and its warm tiers, GPUs, the weight cache."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from ebb.config.values import budget_positive, bytes_or_none, env_name


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
    engine_stall_s: float = Field(
        default=120.0,
        gt=0,
        description="A runner whose engine has been inside one call (a step) this long "
        "while it holds requests is taken for hung: it records the stall "
        "(`ebb_engine_stalls_total`), gives its requests up at once (they run again "
        "elsewhere, or end with `runner_lost`) and kills itself. Its heartbeat runs on "
        "another thread and would keep a hung engine's leases alive for ever. Far above "
        "the longest real step: a long prefill on a CPU takes tens of seconds, a chunked "
        "prefill on a GPU a few.",
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
    claim_balance_ms: int = Field(
        default=200,
        ge=0,
        le=10_000,
        description="Least-loaded claiming: how long a request may be left for a ready "
        "runner of its deployment that claimed within a lease and holds fewer requests "
        "(by more than one, counting the request) than the runner claiming it, which is "
        "woken for it; past this wait any runner takes it, so a lone runner, or one inside "
        "a long engine step, delays no request longer. Critical requests and a prefix the "
        "claiming runner served last are never left. `0`: runners claim in a race.",
    )
    continuations: int = Field(
        default=3,
        ge=0,
        le=20,
        description="How many times a synchronous request whose runner was lost (died, "
        "stalled, stopped heartbeating) is continued on another runner, replaying the "
        "tokens it already produced, before the loss is its answer (`runner_lost`); each "
        "continuation waits up to `EBB_ADMISSION_TIMEOUT_S` for a runner. `0`: a lost "
        "runner's requests fail, as before continuations.",
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
    engine_core_pin: bool | Literal["auto"] = Field(
        default="auto",
        description="A CPU runner whose engine computes on one thread serves from a core "
        "of its own, the last it may use (one runner per host and platform, a lock under "
        "`EBB_HOME`; the others are left to the kernel). `auto`: only where the process "
        "may use exactly 2 cores, where it was measured to help (decode 2.7-3.6 % faster); "
        "`1`: wherever at least 2 cores are allowed; `0`: never (for an operator who pins "
        "processes).",
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
    stem_load_reserve_gib: Annotated[float, Field(ge=0, le=1024)] | Literal["auto"] = Field(
        default="auto",
        description="Memory each stem on a host without GPUs writes before it joins the "
        "pool and frees as its load begins, so that the load writes pages the host already "
        "backs. It pays only on a VM whose host takes free guest memory back (up to half "
        "of a CPU engine build went to those page faults) and costs held memory and a "
        "core's seconds elsewhere. `auto`: 1.5 GiB where a virtio balloon negotiated free "
        "page reporting, none elsewhere; a number: that much on any host; `0`: none. At "
        "most a quarter of the memory available.",
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
        return bytes_or_none(value, info)

    @field_validator("sleep_host_ram_bytes")
    @classmethod
    def _ram_budget(cls, value: int | None, info: ValidationInfo) -> int | None:
        return budget_positive(value, info)


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
        return bytes_or_none(value, info)

    @field_validator("weights_cache_bytes")
    @classmethod
    def _cache_budget(cls, value: int | None, info: ValidationInfo) -> int | None:
        return budget_positive(value, info)

    @field_validator("weights_fetch_concurrency", "weights_fetch_attempts")
    @classmethod
    def _fetch_counts(cls, value: int, info: ValidationInfo) -> int:
        if not 1 <= value <= 256:
            raise ValueError(f"{env_name(info)} must be in [1, 256]")
        return value

    @field_validator("weights_fetch_part_bytes")
    @classmethod
    def _part_size(cls, value: int) -> int:
        if value < 1024 * 1024:
            raise ValueError("EBB_WEIGHTS_FETCH_PART_BYTES must be at least 1 MiB (1048576)")
        return value
