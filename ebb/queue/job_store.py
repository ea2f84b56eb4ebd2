"""Async jobs in Redis: submit, read, list, cancel (frontdoor) and the collector's moves.

Every change of a job is one Lua script (see job_scripts), conditioned on the job's
current attempt and status, so that the frontdoor, runners, reaper and any number of
collectors can act on the same job without a lock and none of their moves is lost or
applied twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.connection import MAX_BLOCK_S
from ebb.queue.job_schema import (
    JobErrorInfo,
    JobEvent,
    JobRecord,
    decode_job,
    encode_fields,
    encode_job,
)
from ebb.queue.job_scripts import JobScripts, Submitted
from ebb.queue.replies import reply_entries, reply_hash, reply_text, reply_texts
from ebb.queue.requests import RepeatFilter
from ebb.queue.schema import RequestEvent, WorkItem, decode_event
from ebb.queue.version_store import VersionStore
from ebb.queue.versions import split_unit, unit_name


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before for a different submission."""

    def __init__(self, job_id: str):
        super().__init__(job_id)
        self.job_id = job_id


@dataclass(frozen=True)
class Announcement:
    """One job event for the job's webhook; an empty body marks it announced without a
    delivery (the webhook did not subscribe to it)."""

    event: JobEvent
    webhook_id: str
    body: str


class JobStore:
    def __init__(self, client: aioredis.Redis, *, retention_s: int, result_ttl_s: int):
        self.redis = client
        self._scripts = JobScripts(client)
        self._retention_s = retention_s
        self._result_ttl_s = result_ttl_s

    # --- frontdoor ---------------------------------------------------------------------

    async def submit(
        self,
        record: JobRecord,
        *,
        ttl_s: int,
        idempotency_digest: str,
        submission_digest: str,
        parked: bool = False,
    ) -> tuple[str, bool]:
        """Store and queue a new job (`parked`: store it in the parked set, for `unpark`);
        returns (job id, replayed). With an idempotency digest, a key seen before returns
        its job, or raises IdempotencyConflict."""
        fields = encode_job(record)
        # The script stamps both from the Redis clock.
        fields.pop("created_ms", None)
        fields.pop("expires_ms", None)
        outcome, job_id = await self._scripts.job_submit(
            record,
            fields=fields,
            ttl_s=ttl_s,
            key_ttl_s=ttl_s + self._retention_s,
            idempotency_digest=idempotency_digest,
            submission_digest=submission_digest,
            parked=parked,
        )
        if outcome is Submitted.CONFLICT:
            raise IdempotencyConflict(job_id)
        if outcome is Submitted.CREATED:
            # Two per submission outpace expiry: the listing stays bounded.
            await self._scripts.job_index_prune(record.tenant, look_at=2)
        return job_id, outcome is Submitted.REPLAYED

    async def get(self, job_id: str) -> JobRecord | None:
        return decode_job(reply_hash(await self.redis.hgetall(keys.job(job_id))))

    async def get_many(self, job_ids: list[str]) -> list[JobRecord | None]:
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hgetall(keys.job(job_id))
        return [decode_job(raw) for raw in await pipe.execute()]

    async def attempt_state(self, request_id: str) -> dict[str, str]:
        """The attempt's request record (state, runner, token counts), without its work."""
        raw = reply_hash(await self.redis.hgetall(keys.request(request_id)))
        return {k.decode(): v.decode() for k, v in raw.items() if k != b"work"}

    async def attempt_states(self, request_ids: list[str]) -> list[str | None]:
        pipe = self.redis.pipeline(transaction=False)
        for request_id in request_ids:
            pipe.hget(keys.request(request_id), "state")
        return [reply_text(state) if state else None for state in await pipe.execute()]

    async def attempt_events(self, request_id: str) -> list[RequestEvent]:
        entries = reply_entries(await self.redis.xrange(keys.events(request_id)))
        repeats = RepeatFilter()
        events = [decode_event(fields[b"e"]) for _, fields in entries]
        return [event for event in events if repeats.keep(event)]

    async def tenant_job_ids(self, tenant: str, *, before: str | None, count: int) -> list[str]:
        """A tenant's job ids, newest first, strictly older than `before` when given."""
        upper = f"({before}" if before else "+"
        ids = await self.redis.zrevrangebylex(
            keys.tenant_jobs(tenant), upper, "-", start=0, num=count
        )
        return reply_texts(ids)

    async def forget_listed(self, tenant: str, job_ids: list[str]) -> None:
        """Drop ids whose job records expired from the tenant's listing."""
        if job_ids:
            await self.redis.zrem(keys.tenant_jobs(tenant), *job_ids)

    async def parked(self, limit: int) -> list[str]:
        """Parked jobs, longest parked first."""
        return reply_texts(await self.redis.zrange(keys.JOBS_PARKED, 0, limit - 1))

    async def unpark(self, record: JobRecord, work: WorkItem, **fields: object) -> bool:
        """Queue `work` as the first attempt of parked `record`, setting `fields`; False
        when it is no longer parked (queued by another frontdoor, cancelled, expired)."""
        fields = {"work": work, "waiting_for": "", "submission": "", **fields}
        return await self._scripts.job_unpark(record.job_id, work, encode_fields(fields))

    async def fail_parked(self, job_id: str, error: JobErrorInfo) -> bool:
        """Fail a parked job (what it waited for failed); False when no longer parked."""
        settled = await self._scripts.job_expire(
            job_id, error=msgspec.json.encode(error), status="failed"
        )
        return settled == "failed"

    async def cancel(self, job_id: str) -> str:
        """'missing', a terminal status (nothing to cancel), 'withdrawn' (cancelled now),
        'aborting' (the runner is asked to abort) or 'pending' (between attempts)."""
        return await self._scripts.job_cancel(job_id)

    # --- collector ---------------------------------------------------------------------

    async def wait_for_activity(self, timeout_s: float) -> None:
        """Block until a job attempt was claimed or ended (or timeout_s passed)."""
        timeout_s = min(max(timeout_s, 0.01), MAX_BLOCK_S)
        if await self.redis.blpop([keys.JOBS_SIGNAL], timeout=timeout_s):
            await self.redis.delete(keys.JOBS_SIGNAL)  # one pass covers every token

    async def watched(self) -> list[str]:
        return sorted(reply_texts(list(await self.redis.smembers(keys.JOBS_WATCH))))

    async def past_deadline(self, limit: int) -> list[str]:
        """Jobs still waiting whose TTL deadline passed (Redis clock)."""
        now_s, now_us = await self.redis.time()
        now_ms = int(now_s) * 1000 + int(now_us) // 1000
        ids = await self.redis.zrangebyscore(keys.JOBS_WAITING, "-inf", now_ms, 0, limit)
        return reply_texts(ids)

    async def expire(self, job_id: str, error: JobErrorInfo) -> str:
        return await self._scripts.job_expire(job_id, error=msgspec.json.encode(error))

    async def update(self, job_id: str, request_id: str, **fields: object) -> bool:
        """Change an unsettled job while `request_id` is its current attempt."""
        return await self._scripts.job_update(
            job_id, request_id=request_id, fields=encode_fields(fields)
        )

    async def requeue(self, record: JobRecord, work: WorkItem, why: JobErrorInfo) -> int:
        """Queue `work` as the job's next attempt; 1 done, 0 moved on, -1 cancel requested.
        Its version no longer serving (a rollout moved on): the primary version's instead."""
        name, version = split_unit(work.deployment)
        split = await VersionStore(self.redis).split(name)
        if split.weights.get(version, 0) == 0 and split.weights.get(split.primary, 0) > 0:
            work = msgspec.structs.replace(work, deployment=unit_name(name, split.primary))
        return await self._scripts.job_requeue(record, work, why=msgspec.json.encode(why))

    async def announce(
        self, record: JobRecord, announcements: list[Announcement], *, delivery_ttl_s: int
    ) -> int:
        """Create the deliveries of new events; stop watching the job once it is settled."""
        events = [(a.event.value, a.webhook_id, a.body) for a in announcements]
        return await self._scripts.job_announce(
            record, events=events, delivery_ttl_s=delivery_ttl_s, retention_s=self._retention_s
        )

    async def shorten_retention(self, job_ids: list[str], *, keep_s: int) -> None:
        """Keep these settled jobs' records at most `keep_s` more (a settled batch's: its
        output and error files hold what they made)."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.expire(keys.job(job_id), keep_s, lt=True)
        await pipe.execute()

    async def release_attempt(self, request_id: str) -> None:
        """A collected attempt's record and stream are no longer needed beyond a while."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.expire(keys.request(request_id), self._result_ttl_s)
        pipe.expire(keys.events(request_id), self._result_ttl_s)
        await pipe.execute()
