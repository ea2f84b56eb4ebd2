"""Settings of work nobody waits for, and of accounting: jobs, webhooks, billing, observability."""

from __future__ import annotations

import ipaddress

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from ebb.config.values import IPNetwork, bytes_or_none, env_name


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
        "frontdoor's watchers look at unsettled batches and parked jobs every four times this.",
    )
    responses_retention_s: int = Field(
        default=30 * 86400,
        ge=60,
        description="How long a stored response of the Responses API (`store`, the "
        "default; background ones too) stays retrievable and continuable by "
        "`previous_response_id`. Each is a Redis key holding its own turn (its input and "
        "output; the earlier turns are read from their own responses), so a chain whose "
        "earlier response expired or was deleted can no longer be continued.",
    )
    responses_max_per_tenant: int = Field(
        default=10_000,
        ge=1,
        description="The most stored responses a tenant keeps at once; past it a stored "
        "`POST /v1/responses` is refused (`403 quota_exceeded`) until some are deleted or "
        "expire (`store: false` still answers).",
    )
    responses_max_tenant_bytes: int = Field(
        default=128 * 1024 * 1024,
        ge=1024,
        description="The most bytes of stored responses a tenant keeps at once (their "
        "records as stored); refused past it as for `EBB_RESPONSES_MAX_PER_TENANT`.",
    )
    responses_max_chain: int = Field(
        default=256,
        ge=1,
        description="The most responses one `previous_response_id` chain may hold; a "
        "longer conversation is started afresh, sending the turns it needs as input.",
    )
    batch_file_max_bytes: int = Field(
        default=64 * 1024 * 1024,
        description="The largest Batch API input file `POST /v1/files` accepts.",
    )
    batch_max_lines: int = Field(
        default=50_000,
        ge=1,
        le=50_000,
        description="The most requests (non-blank lines) one Batch API input file may hold; "
        "`POST /v1/batches` refuses a longer one with a 400 naming its count (OpenAI's cap, "
        "50,000, is the largest allowed). Each line is a job kept in Redis until the batch "
        "settles.",
    )
    files_max_per_tenant: int = Field(
        default=200,
        ge=1,
        description="The most files (inputs and batch outputs) a tenant may store; an upload "
        "past it is a 403 `quota_exceeded` until the tenant deletes some "
        "(`DELETE /v1/files/{id}`). Outputs the platform writes count but are never refused.",
    )
    files_max_bytes_per_tenant: int = Field(
        default=1024 * 1024 * 1024,
        ge=1,
        description="The most bytes a tenant's stored files may hold together (the disk "
        "under `EBB_HOME/files` is also Redis's and the weight cache's); an upload past it "
        "is a 403 `quota_exceeded`, as for the count.",
    )
    files_retention_s: int = Field(
        default=30 * 86400,
        ge=1,
        description="How long a file is kept after it is created (an upload's "
        "`expires_after` may ask for less); the frontdoor's sweep then deletes it and "
        "gives back its share of the tenant's caps.",
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

    @field_validator("responses_max_tenant_bytes", mode="before")
    @classmethod
    def _parse_bytes(cls, value: object, info: ValidationInfo) -> object:
        return bytes_or_none(value, info)

    @field_validator("job_max_attempts")
    @classmethod
    def _attempts_at_least_one(cls, value: int, info: ValidationInfo) -> int:
        if value < 1:
            raise ValueError(f"{env_name(info)} must be at least 1")
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
            raise ValueError(f"{env_name(info)} must be at least 1")
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
            raise ValueError(f"{env_name(info)} must not be negative")
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
