"""Settings of the platform's core: state and Redis, keys and exposure, the frontdoor."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from ebb.config.values import bytes_or_none
from ebb.secrets import SecretBox


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
    redis_maxmemory_bytes: int | None = Field(
        default=None,
        description="The embedded Redis's `maxmemory` (policy `noeviction`: platform state "
        "is never evicted), e.g. `8GiB`; `0`: no limit; unset: a quarter of the host's "
        "RAM. An external Redis (`EBB_REDIS_URL`) keeps its own.",
    )
    redis_tenant_write_high_water: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        description="Past this share of Redis's `maxmemory` (as INFO reports it, the "
        "embedded one's or an external one's), new tenant-fed writes (stored responses, "
        "stream views, file uploads, batches, jobs) are refused with a `503` "
        "(`storage_full`) so that platform state always has room; a Redis without "
        "`maxmemory` refuses none.",
    )
    redis_outage_s: float = Field(
        default=30.0,
        description="How long a process rides out an unreachable Redis (retrying with "
        "backoff) before the work at hand fails cleanly: a runner's output, a frontdoor's "
        "open streams, a job submitted while it restarts.",
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

    @field_validator("redis_maxmemory_bytes", mode="before")
    @classmethod
    def _parse_maxmemory(cls, value: object, info: ValidationInfo) -> object:
        return bytes_or_none(value, info)

    @field_validator("redis_maxmemory_bytes")
    @classmethod
    def _maxmemory_not_negative(cls, value: int | None) -> int | None:
        if value is not None and value < 0:
            raise ValueError("EBB_REDIS_MAXMEMORY_BYTES must not be negative (0: no limit)")
        return value

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
    chat_template_max_steps: int = Field(
        default=1_000_000,
        ge=10_000,
        description="A chat template (a model's own, or a deployment's "
        "`serving.chat_template`) may take this many steps to render one request (each "
        "loop iteration, call, filter and string or list operation is one); past them the "
        "request is a `400` (`chat_template_budget`). A real template takes a few dozen "
        "per message.",
    )
    chat_template_timeout_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="A chat template render stops (`400`) after this long, checked inside "
        "the render at every step (a thread cannot be killed, so the budget is what stops "
        "the work). Renders run off the event loop, except short bodies' first "
        "few thousand steps.",
    )
    chat_template_max_output_chars: int = Field(
        default=4 * 2**20,
        ge=65536,
        description="A chat template's rendered prompt, and any one string or list it "
        "builds (a list's items count 8 characters each), is at most this long; all the "
        "values one render builds together at most 16 times it. A prompt a model's context "
        "holds is far shorter (about 4 characters a token: 4M for a 1M-token context).",
    )
    chat_template_processes: int = Field(
        default=2,
        ge=0,
        le=64,
        description="Worker processes (per frontdoor process) that render chat templates "
        "off the event loop: in a process a render does not hold the frontdoor's GIL, "
        "so a slow template slows no other request. `0`: in a thread of the frontdoor.",
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
        return bytes_or_none(value, info)

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
    frontdoor_drain_s: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="On SIGTERM a frontdoor stops admitting (its port refuses new "
        "connections) and lets the streams it is serving finish for at most this long "
        "before it exits; a stream cut then keeps running, and its client resumes it on "
        "another frontdoor. The Kubernetes manifest's terminationGracePeriodSeconds covers it.",
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
    shed_queue_fraction: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Once a deployment's queue holds this share of its depth limit, "
        "requests of priority class `sheddable` are refused at once with `503` (code "
        "`shed`), keeping the room for `critical` and `standard` work; 1: shed only when full.",
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
