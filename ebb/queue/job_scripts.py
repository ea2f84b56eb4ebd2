"""The Lua scripts behind jobs and webhook deliveries, each behind a typed call.

Each is one atomic state change; the header of each .lua file states its contract. As in
`scripts`, callers pass named, typed parameters and get typed replies: the KEYS and ARGV
lists, and every key name in them, are built here. All are called on an asyncio client
(frontdoor, webhooks worker).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import IntEnum

import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.job_schema import ANNOUNCED_PREFIX, TERMINAL_STATUSES, JobRecord
from ebb.queue.priority import score_offset_ms
from ebb.queue.replies import reply_int, reply_list, reply_text, reply_texts
from ebb.queue.schema import WorkItem, encode
from ebb.queue.scripts import Arg, register_async


class Submitted(IntEnum):
    """How job_submit.lua answered a submission."""

    CREATED = 1
    REPLAYED = 2  # the Idempotency-Key was seen before with this very submission
    CONFLICT = 3  # the Idempotency-Key was seen before with another submission


def _pairs(fields: Mapping[str, str]) -> list[Arg]:
    return [item for pair in fields.items() for item in pair]


class JobScripts:
    """Job and delivery scripts bound to one asyncio client."""

    def __init__(self, client: aioredis.Redis):
        self._job_submit = register_async(client, "job_submit")
        self._job_cancel = register_async(client, "job_cancel")
        self._job_update = register_async(client, "job_update")
        self._job_requeue = register_async(client, "job_requeue")
        self._job_expire = register_async(client, "job_expire")
        self._job_unpark = register_async(client, "job_unpark")
        self._job_index_prune = register_async(client, "job_index_prune")
        self._job_announce = register_async(client, "job_announce")
        self._delivery_claim = register_async(client, "delivery_claim")
        self._delivery_record = register_async(client, "delivery_record")
        self._delivery_renew = register_async(client, "delivery_renew")
        self._secret_rotate = register_async(client, "secret_rotate")

    # --- jobs ------------------------------------------------------------------------

    async def job_submit(
        self,
        record: JobRecord,
        *,
        fields: Mapping[str, str],
        ttl_s: int,
        key_ttl_s: int,
        idempotency_digest: str,
        submission_digest: str,
        parked: bool = False,
    ) -> tuple[Submitted, str]:
        """Store `record` (its hash `fields`) and queue its first attempt, in its work's
        priority class, in the job queue of the unit its work names (the version the
        traffic split picked), or,
        `parked`, in the parked set without an attempt; with an idempotency digest, a key
        seen before answers with its job id instead."""
        unit = record.work.deployment
        reply = reply_list(
            await self._job_submit(
                keys=[
                    keys.job(record.job_id),
                    keys.request(record.request_id),
                    keys.job_queue(unit),
                    keys.JOBS_WAITING,
                    keys.tenant_jobs(record.tenant),
                    keys.job_idempotency(record.tenant, idempotency_digest or "-"),
                    keys.queue_signal(unit),
                    keys.WAKE,
                    keys.JOBS_PARKED,
                ],
                args=[
                    record.job_id,
                    record.request_id,
                    unit,
                    ttl_s * 1000,
                    key_ttl_s,
                    f"{record.job_id}|{submission_digest}" if idempotency_digest else "",
                    submission_digest,
                    keys.SIGNAL_LIST_MAX,
                    encode(record.work),
                    keys.JOB_PREFIX,
                    "1" if parked else "",
                    score_offset_ms(record.work.priority),
                    *_pairs(fields),
                ],
            )
        )
        return Submitted(reply_int(reply[0])), reply_text(reply[1])

    async def job_cancel(self, job_id: str) -> str:
        """'missing', a terminal status, 'withdrawn', 'aborting' or 'pending'."""
        return reply_text(
            await self._job_cancel(
                keys=[keys.job(job_id), keys.JOBS_WATCH, keys.JOBS_WAITING, keys.JOBS_PARKED],
                args=[
                    job_id,
                    keys.REQUEST_PREFIX,
                    keys.JOB_QUEUE_PREFIX,
                    keys.RUNNER_CANCELS_PREFIX,
                    *TERMINAL_STATUSES,
                ],
            )
        )

    async def job_index_prune(self, tenant: str, *, look_at: int) -> int:
        """Drop up to `look_at` of the tenant's oldest listed jobs that expired."""
        return reply_int(
            await self._job_index_prune(
                keys=[keys.tenant_jobs(tenant)], args=[keys.JOB_PREFIX, look_at]
            )
        )

    async def job_expire(self, job_id: str, *, error: bytes, status: str = "expired") -> str:
        """`status` ('expired'; 'failed' settles a parked job only), or the job's or its
        attempt's state when it was left alone."""
        return reply_text(
            await self._job_expire(
                keys=[keys.job(job_id), keys.JOBS_WAITING, keys.JOBS_WATCH, keys.JOBS_PARKED],
                args=[job_id, keys.REQUEST_PREFIX, keys.JOB_QUEUE_PREFIX, error, status],
            )
        )

    async def job_unpark(self, job_id: str, work: WorkItem, fields: Mapping[str, str]) -> bool:
        """Queue the first attempt (`work`) of a job still parked; False: left alone."""
        unit = work.deployment
        return bool(
            reply_int(
                await self._job_unpark(
                    keys=[
                        keys.job(job_id),
                        keys.request(work.request_id),
                        keys.job_queue(unit),
                        keys.JOBS_PARKED,
                        keys.queue_signal(unit),
                        keys.WAKE,
                    ],
                    args=[
                        job_id,
                        work.request_id,
                        unit,
                        keys.SIGNAL_LIST_MAX,
                        encode(work),
                        score_offset_ms(work.priority),
                        *_pairs(fields),
                    ],
                )
            )
        )

    async def job_update(self, job_id: str, *, request_id: str, fields: Mapping[str, str]) -> bool:
        """Set `fields` on an unsettled job while `request_id` is its current attempt."""
        return bool(
            reply_int(
                await self._job_update(
                    keys=[keys.job(job_id)],
                    args=[
                        request_id,
                        len(TERMINAL_STATUSES),
                        *TERMINAL_STATUSES,
                        *_pairs(fields),
                    ],
                )
            )
        )

    async def job_requeue(self, record: JobRecord, work: WorkItem, *, why: bytes) -> int:
        """Queue `work` as the next attempt of `record`'s job: 1 done, 0 the job moved
        on, -1 a cancel was requested. It goes to the unit `work` names."""
        return reply_int(
            await self._job_requeue(
                keys=[
                    keys.job(record.job_id),
                    keys.request(work.request_id),
                    keys.job_queue(work.deployment),
                    keys.JOBS_WAITING,
                    keys.JOBS_WATCH,
                    keys.queue_signal(work.deployment),
                    keys.WAKE,
                ],
                args=[
                    record.job_id,
                    record.request_id,
                    work.request_id,
                    encode(work),
                    work.deployment,
                    keys.JOB_ATTEMPT_TTL_S,
                    keys.SIGNAL_LIST_MAX,
                    why,
                    record.attempt + 1,
                    score_offset_ms(work.priority),
                ],
            )
        )

    async def job_announce(
        self,
        record: JobRecord,
        *,
        events: Iterable[tuple[str, str, str]],
        delivery_ttl_s: int,
        retention_s: int,
    ) -> int:
        """Mark `events` (event, webhook id, body; body empty: no delivery) announced and
        create their deliveries; the number created."""
        return reply_int(
            await self._job_announce(
                keys=[
                    keys.job(record.job_id),
                    keys.job_deliveries(record.job_id),
                    keys.DELIVERIES_DUE,
                    keys.DELIVERIES_SIGNAL,
                    keys.JOBS_WATCH,
                    keys.JOBS_WAITING,
                ],
                args=[
                    record.job_id,
                    record.tenant,
                    record.webhook_url,
                    keys.DELIVERY_PREFIX,
                    delivery_ttl_s,
                    retention_s,
                    keys.SIGNAL_LIST_MAX,
                    ANNOUNCED_PREFIX,
                    record.work.traceparent,
                    len(TERMINAL_STATUSES),
                    *TERMINAL_STATUSES,
                    *(item for event in events for item in event),
                ],
            )
        )

    # --- deliveries and secrets --------------------------------------------------------

    async def delivery_claim(self, *, limit: int, lease_ms: int, owner: str) -> list[str]:
        """Take up to `limit` due deliveries under a lease; their webhook ids."""
        return reply_texts(
            await self._delivery_claim(
                keys=[keys.DELIVERIES_DUE], args=[limit, lease_ms, owner, keys.DELIVERY_PREFIX]
            )
        )

    async def delivery_renew(
        self, webhook_ids: Iterable[str], *, lease_ms: int, owner: str
    ) -> None:
        await self._delivery_renew(
            keys=[keys.DELIVERIES_DUE],
            args=[lease_ms, owner, keys.DELIVERY_PREFIX, *webhook_ids],
        )

    async def delivery_record(
        self,
        webhook_id: str,
        *,
        owner: str,
        attempt: bytes,
        outcome: str,
        next_ms: int,
        status_code: int,
        error: str,
        record_ttl_s: int,
    ) -> bool:
        """Record an attempt; True when the schedule changed."""
        return bool(
            reply_int(
                await self._delivery_record(
                    keys=[
                        keys.delivery(webhook_id),
                        keys.delivery_attempts(webhook_id),
                        keys.DELIVERIES_DUE,
                    ],
                    args=[
                        webhook_id,
                        owner,
                        attempt,
                        outcome,
                        next_ms,
                        status_code,
                        error,
                        record_ttl_s,
                    ],
                )
            )
        )

    async def secret_rotate(self, tenant: str, *, secret: str, overlap_ms: int) -> int:
        """Make `secret` current, the old one valid `overlap_ms` more; the overlap's end."""
        return reply_int(
            await self._secret_rotate(keys=[keys.webhook_secret(tenant)], args=[secret, overlap_ms])
        )
