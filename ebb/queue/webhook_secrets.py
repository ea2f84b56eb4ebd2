"""Per-tenant webhook signing secrets in Redis, with an overlap period after rotation.

Secrets are stored as they are: signing needs the key itself (HMAC), so unlike API keys
they cannot be kept as digests. Anyone who can read Redis can forge webhooks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.job_scripts import JobScripts
from ebb.queue.replies import reply_hash


@dataclass(frozen=True)
class SecretSet:
    current: str
    previous: str = ""
    previous_until_ms: int = 0
    rotated_ms: int = 0

    def signing_secrets(self, now_ms: int | None = None) -> list[str]:
        """The secrets a delivery is signed with now: current, plus previous in overlap."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        if self.previous and now_ms < self.previous_until_ms:
            return [self.current, self.previous]
        return [self.current]


class WebhookSecrets:
    def __init__(self, client: aioredis.Redis):
        self.redis = client
        self._scripts = JobScripts(client)

    async def get(self, tenant: str) -> SecretSet | None:
        raw = reply_hash(await self.redis.hgetall(keys.webhook_secret(tenant)))
        if b"current" not in raw:
            return None
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        return SecretSet(
            current=fields["current"],
            previous=fields.get("previous", ""),
            previous_until_ms=int(fields.get("previous_until_ms", 0)),
            rotated_ms=int(fields.get("rotated_ms", 0)),
        )

    async def ensure(self, tenant: str, fresh: str) -> SecretSet:
        """The tenant's secrets, creating the first one (`fresh`) if there is none."""
        key = keys.webhook_secret(tenant)
        if await self.redis.hsetnx(key, "current", fresh):
            await self.redis.hset(key, "rotated_ms", int(time.time() * 1000))
        return await self.get(tenant) or SecretSet(current=fresh)

    async def rotate(self, tenant: str, fresh: str, overlap_s: float) -> SecretSet:
        await self._scripts.secret_rotate(tenant, secret=fresh, overlap_ms=int(overlap_s * 1000))
        return await self.get(tenant) or SecretSet(current=fresh)
