"""Rate limits in Redis: per API key and per tenant, requests and tokens per minute.

Limits are configured per subject ("key:ID" or "tenant:NAME"); the buckets that enforce
them live in lua/ratelimit.lua, which checks and takes from a key's and its tenant's
buckets in one atomic step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec
import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.replies import reply_text, reply_texts
from ebb.queue.scripts import register_async

_KINDS = {"rpm": "requests_per_minute", "tpm": "tokens_per_minute"}


class RateLimits(msgspec.Struct, kw_only=True, frozen=True):
    requests_per_minute: int | None = None  # None: unlimited
    tokens_per_minute: int | None = None


@dataclass(frozen=True)
class LimitOutcome:
    status: str  # "none" (no limit applies), "ok", "limited" or "too_large"
    subject: str = ""  # the subject whose limit refused it
    kind: str = ""  # "rpm" or "tpm"
    wait_ms: int = 0  # "limited": until the bucket holds enough
    limit: int = 0


def key_subject(key_id: str) -> str:
    return f"key:{key_id}"


def tenant_subject(tenant: str) -> str:
    return f"tenant:{tenant}"


class RateLimitStore:
    def __init__(self, client: aioredis.Redis):
        self._redis = client
        self._script = register_async(client, "ratelimit")
        # Bumped by every `set_limits` through this store: a cache of who has limits
        # (`ebb.frontdoor.limit_presence`) reads again rather than wait out its period.
        self.changes = 0

    async def any_limit(self, key_id: str, tenant: str) -> bool:
        """Whether the key or its tenant has any limit: without one, `reserve` answers
        "none", and an admission can skip it (one round trip)."""
        subjects = (key_subject(key_id), tenant_subject(tenant))
        fields = [f"{subject}:{kind}" for subject in subjects for kind in _KINDS]
        return any(await self._redis.hmget(keys.RATE_LIMITS, fields))

    async def reserve(self, key_id: str, tenant: str, tokens: int) -> LimitOutcome:
        """Take one request and `tokens` from the key's and the tenant's buckets, or none."""
        reply = await self._call(key_id, tenant, mode="reserve", requests=1, tokens=tokens)
        status = reply[0]
        if status == "limited":
            return LimitOutcome(status, reply[1], reply[2], int(reply[3]), int(reply[4]))
        if status == "too_large":
            return LimitOutcome(status, reply[1], reply[2], limit=int(reply[3]))
        return LimitOutcome(status)

    async def adjust(self, key_id: str, tenant: str, *, requests: int, tokens: int) -> None:
        """Give back what a reservation did not use (negative: take what it overran)."""
        await self._call(key_id, tenant, mode="adjust", requests=requests, tokens=tokens)

    async def _call(
        self,
        key_id: str,
        tenant: str,
        *,
        mode: Literal["reserve", "adjust"],
        requests: int,
        tokens: int,
    ) -> list[str]:
        """lua/ratelimit.lua on the key's and the tenant's buckets; its reply as text."""
        key, tenant_ = key_subject(key_id), tenant_subject(tenant)
        return reply_texts(
            await self._script(
                keys=[keys.RATE_LIMITS, keys.rate_bucket(key), keys.rate_bucket(tenant_)],
                args=[key, tenant_, mode, requests, tokens, keys.RATE_BUCKET_TTL_S],
            )
        )

    async def set_limits(self, subject: str, limits: RateLimits) -> None:
        self.changes += 1
        pipe = self._redis.pipeline(transaction=True)
        for kind, attribute in _KINDS.items():
            value = getattr(limits, attribute)
            if value is None:
                pipe.hdel(keys.RATE_LIMITS, f"{subject}:{kind}")
            else:
                pipe.hset(keys.RATE_LIMITS, f"{subject}:{kind}", str(value))
        # A changed limit starts from a full bucket of its new size.
        pipe.delete(keys.rate_bucket(subject))
        await pipe.execute()

    async def all_limits(self) -> dict[str, RateLimits]:
        """{subject: its limits} for every subject with at least one limit."""
        fields: dict[str, dict[str, int]] = {}
        for name, value in (await self._redis.hgetall(keys.RATE_LIMITS)).items():
            subject, _, kind = reply_text(name).rpartition(":")
            fields.setdefault(subject, {})[_KINDS[kind]] = int(value)
        return {subject: RateLimits(**values) for subject, values in fields.items()}

    async def limits(self, subject: str) -> RateLimits:
        rpm, tpm = await self._redis.hmget(keys.RATE_LIMITS, f"{subject}:rpm", f"{subject}:tpm")
        return RateLimits(
            requests_per_minute=int(rpm) if rpm else None,
            tokens_per_minute=int(tpm) if tpm else None,
        )
