"""Webhook deliveries in Redis: the due schedule, in-flight leases and attempt records.

A delivery is due when its score in the due set is in the past (Redis clock). Taking it
moves its score to the end of an in-flight lease, so a worker that dies mid-attempt only
delays it; recording an attempt moves it to its next attempt time or out of the set.
"""

from __future__ import annotations

import msgspec
import redis.asyncio as aioredis

from ebb.queue import keys, observations
from ebb.queue.connection import MAX_BLOCK_S
from ebb.queue.job_schema import DeliveryAttempt, DeliveryRecord, decode_delivery
from ebb.queue.job_scripts import JobScripts
from ebb.queue.replies import reply_texts


def delivery_record_ttl_s(give_up_s: float, job_retention_s: int) -> int:
    """Deliveries stay readable through their retry period and the job's retention."""
    return int(give_up_s) + job_retention_s


class DeliveryStore:
    def __init__(self, client: aioredis.Redis, *, record_ttl_s: int):
        self.redis = client
        self._scripts = JobScripts(client)
        self._record_ttl_s = record_ttl_s

    async def claim_due(self, limit: int, *, lease_ms: int, owner: str) -> list[DeliveryRecord]:
        ids = await self._scripts.delivery_claim(limit=limit, lease_ms=lease_ms, owner=owner)
        if not ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for webhook_id in ids:
            pipe.hgetall(keys.delivery(webhook_id))
        return [r for r in map(decode_delivery, await pipe.execute()) if r is not None]

    async def renew(self, webhook_ids: list[str], *, lease_ms: int, owner: str) -> None:
        if webhook_ids:
            await self._scripts.delivery_renew(webhook_ids, lease_ms=lease_ms, owner=owner)

    async def record(
        self,
        webhook_id: str,
        *,
        owner: str,
        attempt: DeliveryAttempt,
        outcome: str,
        next_ms: int = 0,
    ) -> bool:
        """Record an attempt; outcome 'delivered', 'retry' (at next_ms) or 'failed'."""
        recorded = await self._scripts.delivery_record(
            webhook_id,
            owner=owner,
            attempt=msgspec.json.encode(attempt),
            outcome=outcome,
            next_ms=next_ms,
            status_code=attempt.status_code or 0,
            error=attempt.error or "",
            record_ttl_s=self._record_ttl_s,
        )
        if recorded:
            await observations.count_async(self.redis, observations.WEBHOOK_DELIVERIES, (outcome,))
        return bool(recorded)

    async def seconds_to_next_due(self) -> float | None:
        """How long until the earliest scheduled delivery is due (0 if overdue)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrange(keys.DELIVERIES_DUE, 0, 0, withscores=True)
        pipe.time()
        head, (now_s, now_us) = await pipe.execute()
        if not head:
            return None
        due_ms = float(head[0][1])
        now_ms = int(now_s) * 1000 + int(now_us) / 1000
        return max(0.0, (due_ms - now_ms) / 1000)

    async def wait_for_new(self, timeout_s: float) -> None:
        """Block until a delivery was created (or timeout_s passed)."""
        timeout_s = min(max(timeout_s, 0.01), MAX_BLOCK_S)
        await self.redis.blpop([keys.DELIVERIES_SIGNAL], timeout=timeout_s)

    async def for_job(self, job_id: str) -> list[tuple[DeliveryRecord, list[DeliveryAttempt]]]:
        """A job's deliveries in creation order, each with its attempts, oldest first."""
        ids = reply_texts(await self.redis.lrange(keys.job_deliveries(job_id), 0, -1))
        if not ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for webhook_id in ids:
            pipe.hgetall(keys.delivery(webhook_id))
            pipe.lrange(keys.delivery_attempts(webhook_id), 0, -1)
        replies = await pipe.execute()
        out = []
        for raw, attempts in zip(replies[::2], replies[1::2], strict=True):
            record = decode_delivery(raw)
            if record is not None:
                decoded = [msgspec.json.decode(a, type=DeliveryAttempt) for a in attempts]
                out.append((record, decoded))
        return out
