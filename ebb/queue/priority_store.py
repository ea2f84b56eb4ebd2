"""Priority classes of API keys and tenants in Redis (one hash, `keys.PRIORITIES`:
subject "key:ID" or "tenant:NAME" -> class). See ebb.queue.priority for the rules."""

from __future__ import annotations

import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.priority import PRIORITIES, Priority, effective_priority
from ebb.queue.ratelimits import key_subject, tenant_subject
from ebb.queue.replies import reply_text


class PriorityStore:
    def __init__(self, client: aioredis.Redis):
        self._redis = client

    async def set(self, subject: str, priority: Priority | None) -> None:
        """`priority` None: the subject has no class of its own (it inherits)."""
        if priority is None:
            await self._redis.hdel(keys.PRIORITIES, subject)
        else:
            await self._redis.hset(keys.PRIORITIES, subject, priority)

    async def get(self, subject: str) -> Priority | None:
        raw = await self._redis.hget(keys.PRIORITIES, subject)
        return _known(reply_text(raw) if raw else None)

    async def effective(self, key_id: str, tenant: str) -> Priority:
        """The class a request of `key_id` (of `tenant`) is queued in."""
        key, tenant_ = await self._redis.hmget(
            keys.PRIORITIES, key_subject(key_id), tenant_subject(tenant)
        )
        return effective_priority(
            reply_text(key) if key else None, reply_text(tenant_) if tenant_ else None
        )

    async def all(self) -> dict[str, Priority]:
        """{subject: its own class} for every subject that has one."""
        found = {}
        for subject, value in (await self._redis.hgetall(keys.PRIORITIES)).items():
            known = _known(reply_text(value))
            if known is not None:
                found[reply_text(subject)] = known
        return found


def _known(value: str | None) -> Priority | None:
    return value if value in PRIORITIES else None
