"""Redis clients for the two sides: asyncio (frontdoor, controller) and blocking (runner)."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis


def async_client(url: str) -> aioredis.Redis:
    # Blocking reads (XREAD BLOCK per in-flight request) each hold a pooled connection,
    # so the pool must not be the limit on concurrency.
    return aioredis.Redis.from_url(url, decode_responses=False, health_check_interval=30)


def sync_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=False, health_check_interval=30)
