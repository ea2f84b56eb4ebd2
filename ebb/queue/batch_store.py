"""Batches of the Batch API: their records in Redis, one key per batch.

A batch is a set of jobs (one per line of its input file) plus what the API shows of it;
the jobs carry the work, retries, expiry and billing. The record is written whole: only
the frontdoor changes it (status transitions are idempotent, see routes_batches), so one
key needs no script; creating it also lists it under its tenant, which is one script.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec
from redis import asyncio as aioredis

from ebb.queue import keys
from ebb.queue.scripts import register_async


class BatchStatus(enum.StrEnum):
    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in (self.COMPLETED, self.FAILED, self.EXPIRED, self.CANCELLED)


class BatchLine(msgspec.Struct, frozen=True):
    """One input line: its custom_id and the job that runs it ("" if it was refused, or
    is still waiting for its caller's rate limits: `pending`)."""

    custom_id: str
    job_id: str = ""
    # Why the line was refused before it ran: OpenAI's error object ({code, message}).
    error: dict[str, Any] | None = None

    @property
    def pending(self) -> bool:
        """Not queued yet: released once its key's and tenant's rate limits allow."""
        return not self.job_id and self.error is None


class BatchRecord(msgspec.Struct, kw_only=True):
    batch_id: str
    tenant: str
    key_id: str = ""  # the key that created it: its lines are that key's jobs
    endpoint: str  # "/v1/chat/completions" | "/v1/completions"
    input_file_id: str
    completion_window: str
    created_at_s: int
    expires_at_s: int
    status: BatchStatus = BatchStatus.IN_PROGRESS
    lines: list[BatchLine] = []
    metadata: dict[str, str] = {}
    output_file_id: str | None = None
    error_file_id: str | None = None
    cancelling_at_s: int | None = None
    finalizing_at_s: int | None = None
    completed_at_s: int | None = None
    failed_at_s: int | None = None
    expired_at_s: int | None = None
    cancelled_at_s: int | None = None
    in_progress_at_s: int | None = None
    # Where its batch.completed event goes ("" for none).
    webhook_url: str = ""
    # Why a batch failed (OpenAI's errors.data: {code, message, param, line}).
    errors: list[dict[str, Any]] = []
    # When its pending lines may be tried against the rate limits again (epoch s; 0: now).
    release_at_s: float = 0.0
    # What its pending lines wait for: "rate_limits", or a passing state of the
    # deployment ("weights_preparing", "redis_unavailable"); named if the window ends.
    waiting_for: str = ""
    # Its request counts once settled ({total, completed, failed}): its jobs' records are
    # then let go (the output and error files hold what they made), so these stay.
    final_counts: dict[str, int] | None = None


class BatchStore:
    def __init__(self, client: aioredis.Redis, *, retention_s: int, delivery_ttl_s: int):
        self.redis = client
        self._retention_s = retention_s
        self._delivery_ttl_s = delivery_ttl_s
        self._create = register_async(client, "batch_create")
        self._settle = register_async(client, "batch_settle")
        self._work_hold = register_async(client, "batch_work_hold")

    async def create(self, record: BatchRecord) -> bool:
        reply = await self._create(
            keys=[
                keys.batch(record.batch_id),
                keys.tenant_batches(record.tenant),
                keys.BATCHES_ACTIVE,
            ],
            args=[msgspec.json.encode(record), record.batch_id, self._retention_s],
        )
        return bool(int(reply))

    async def settle(self, record: BatchRecord, *, webhook_id: str, body: str) -> bool:
        """Store the settled `record`; its webhook delivery is created once. True if now."""
        reply = await self._settle(
            keys=[
                keys.batch(record.batch_id),
                keys.BATCHES_ACTIVE,
                keys.batch_announced(record.batch_id),
                keys.job_deliveries(record.batch_id),
                keys.DELIVERIES_DUE,
                keys.DELIVERIES_SIGNAL,
            ],
            args=[
                msgspec.json.encode(record),
                record.batch_id,
                self._retention_s,
                record.tenant,
                record.webhook_url,
                webhook_id,
                body,
                keys.DELIVERY_PREFIX,
                self._delivery_ttl_s,
                keys.SIGNAL_LIST_MAX,
            ],
        )
        return bool(int(reply))

    async def hold_work(self, batch_id: str, holder: str, *, ttl_s: float) -> bool:
        """Take or renew the lease on queueing `batch_id`'s lines; True if `holder` has it."""
        reply = await self._work_hold(
            keys=[keys.batch_worker(batch_id)], args=[holder, max(1, int(ttl_s * 1000))]
        )
        return bool(int(reply))

    async def active_ids(self) -> list[str]:
        ids = await self.redis.smembers(keys.BATCHES_ACTIVE)
        return sorted(i.decode() if isinstance(i, bytes) else i for i in ids)

    async def forget_active(self, batch_id: str) -> None:
        await self.redis.srem(keys.BATCHES_ACTIVE, batch_id)

    async def get(self, batch_id: str) -> BatchRecord | None:
        raw = await self.redis.get(keys.batch(batch_id))
        return None if raw is None else msgspec.json.decode(raw, type=BatchRecord)

    async def put(self, record: BatchRecord) -> None:
        await self.redis.set(
            keys.batch(record.batch_id), msgspec.json.encode(record), ex=self._retention_s
        )

    async def tenant_batch_ids(self, tenant: str, *, before: str | None, count: int) -> list[str]:
        """A tenant's batch ids, newest first, older than `before` when given."""
        upper = f"({before}" if before else "+"
        ids = await self.redis.zrevrangebylex(
            keys.tenant_batches(tenant), upper, "-", start=0, num=count
        )
        return [i.decode() if isinstance(i, bytes) else i for i in ids]
