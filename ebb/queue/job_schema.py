"""Async jobs and their webhook deliveries, as stored in Redis (msgspec structs).

A job runs as one or more attempts. Each attempt is an ordinary `WorkItem` (request id
`<job id>.<attempt>`, `job_id` set) in its deployment's job queue, claimed, leased, streamed
and finished like a synchronous request. The webhooks worker's collector turns a finished
attempt into the job's result, a lost one into the next attempt, and each event a job's
webhook subscribed to into one `DeliveryRecord` with a stable webhook id.

Records are Redis hashes with one field per attribute (Lua scripts read and change single
fields); nested values are JSON.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import msgspec

from ebb.queue.budget_schema import BudgetReservation
from ebb.queue.schema import ToolCallFormat, WorkItem


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def is_terminal(self) -> bool:
        return self not in (JobStatus.QUEUED, JobStatus.RUNNING)


class JobEvent(enum.StrEnum):
    STARTED = "job.started"
    SUCCEEDED = "job.succeeded"
    FAILED = "job.failed"
    CANCELLED = "job.cancelled"
    # Not a job's: a Batch API batch settled (its deliveries use the batch id as job id).
    BATCH_COMPLETED = "batch.completed"
    # Not a job's: a budget's spend crossed its soft limit (lua/budget_settle.lua; the
    # delivery's job id is the period's spend key).
    BUDGET_SOFT_LIMIT_REACHED = "budget.soft_limit_reached"

    @classmethod
    def ending(cls, status: JobStatus) -> JobEvent:
        """The event announcing a terminal status; a job that expired in the queue failed."""
        if status is JobStatus.SUCCEEDED:
            return cls.SUCCEEDED
        if status is JobStatus.CANCELLED:
            return cls.CANCELLED
        return cls.FAILED


# Terminal statuses as Lua sees them (scripts refuse to change a settled job).
TERMINAL_STATUSES = tuple(s.value for s in JobStatus if s.is_terminal)
# Hash field prefix marking an event as announced (its value: the webhook id, or "-").
ANNOUNCED_PREFIX = "ann:"


class JobErrorInfo(msgspec.Struct, frozen=True):
    code: str
    message: str


class JobRecord(msgspec.Struct, kw_only=True):
    job_id: str
    tenant: str
    deployment: str
    endpoint: str  # "chat.completions" | "completions" | "embeddings"
    # The first attempt's work; later attempts differ only in request_id.
    work: WorkItem
    request_id: str  # the current attempt's
    status: JobStatus = JobStatus.QUEUED
    attempt: int = 1
    max_attempts: int = 3
    created_ms: int = 0
    # Still queued at this instant (Redis clock, ms): the job expires.
    expires_ms: int = 0
    started_ms: int = 0  # the current (or last) attempt's claim
    finished_ms: int = 0
    runner_id: str = ""
    cancel_requested: bool = False
    webhook_url: str = ""
    webhook_events: list[JobEvent] = []
    metadata: dict[str, str] = {}
    # Set when the chat request declared tools: how its result's text becomes tool calls.
    tools: ToolCallFormat | None = None
    # An embeddings job's vectors in its result: "float" lists or "base64".
    encoding_format: str = "float"
    result: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    error: JobErrorInfo | None = None
    # Why the previous attempt ended, when the job was put back in the queue.
    last_error: JobErrorInfo | None = None
    # Tokens taken from the caller's rate limits at submission (0: none applied); the
    # collector gives back what the job did not use once it settles.
    rate_reserved_tokens: int = 0
    # Its reservation against the caller's spend caps (None: no budget applied); the
    # collector settles it to the job's cost once it settles (ebb/webhooks/job_budgets).
    budget_reservation: BudgetReservation | None = None
    # Parked (accepted before its request could be tokenized): the passing state it waits
    # for ("weights_preparing") and its submission (JSON), to be tokenized once that passed.
    waiting_for: str = ""
    submission: str = ""
    # Events already turned into deliveries (read from the ANNOUNCED_PREFIX fields).
    announced: list[JobEvent] = []


class DeliveryState(enum.StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # gave up after the retry period


class DeliveryRecord(msgspec.Struct, kw_only=True):
    """One event of one job for its webhook: the body is frozen when the event happens, so
    every attempt sends the same bytes under the same webhook id."""

    webhook_id: str
    job_id: str
    tenant: str
    url: str
    event: JobEvent
    body: str
    created_ms: int
    state: DeliveryState = DeliveryState.PENDING
    attempts: int = 0
    next_ms: int = 0
    delivered_ms: int = 0
    last_status: int = 0
    last_error: str = ""
    owner: str = ""  # the worker attempting it now, if any
    # The W3C trace context of the job that caused it: its delivery spans join that trace.
    traceparent: str = ""


class DeliveryAttempt(msgspec.Struct, kw_only=True, frozen=True):
    at_ms: int
    latency_ms: float
    status_code: int | None = None
    error: str | None = None


_JSON_FIELDS = frozenset(
    {
        "work",
        "webhook_events",
        "metadata",
        "result",
        "usage",
        "error",
        "last_error",
        "tools",
        "budget_reservation",
    }
)


def attempt_request_id(job_id: str, attempt: int) -> str:
    return f"{job_id}.{attempt}"


def encode_fields(fields: Mapping[str, object]) -> dict[str, str]:
    """Hash fields for (part of) a JobRecord or DeliveryRecord; None values are left out."""
    out: dict[str, str] = {}
    for name, value in fields.items():
        if value is None or name == "announced":
            continue
        if name in _JSON_FIELDS:
            out[name] = msgspec.json.encode(value).decode()
        elif isinstance(value, enum.Enum):
            out[name] = str(value.value)
        elif isinstance(value, bool):
            out[name] = "1" if value else "0"
        else:
            out[name] = str(value)
    return out


def encode_job(record: JobRecord) -> dict[str, str]:
    return encode_fields(msgspec.structs.asdict(record))


def decode_job(raw: Mapping[bytes, bytes]) -> JobRecord | None:
    if not raw or b"job_id" not in raw:
        return None
    fields: dict[str, object] = {}
    announced = []
    for key, value in raw.items():
        name, text = key.decode(), value.decode()
        if name.startswith(ANNOUNCED_PREFIX):
            announced.append(name[len(ANNOUNCED_PREFIX) :])
        elif name in _JSON_FIELDS:
            fields[name] = msgspec.json.decode(text)
        elif name in JobRecord.__struct_fields__:
            fields[name] = text
    fields["announced"] = announced
    return msgspec.convert(fields, JobRecord, strict=False)


def decode_delivery(raw: Mapping[bytes, bytes]) -> DeliveryRecord | None:
    if not raw or b"webhook_id" not in raw:
        return None
    known = DeliveryRecord.__struct_fields__
    fields = {k.decode(): v.decode() for k, v in raw.items() if k.decode() in known}
    return msgspec.convert(fields, DeliveryRecord, strict=False)
