"""Redis clients for the two sides: asyncio (frontdoor, controller) and blocking (runner)."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff

# In-flight requests one frontdoor process can follow at once.
ASYNC_POOL_MAX = 8192
# A reply slower than this means Redis is gone. Every blocking command (BLPOP, XREAD
# BLOCK) blocks for at most MAX_BLOCK_S, well inside it.
SOCKET_TIMEOUT_S = 30.0
MAX_BLOCK_S = 5.0
RETRIES = 4


def async_client(url: str) -> aioredis.Redis:
    # Blocking reads (XREAD BLOCK per in-flight request) each hold a pooled connection,
    # so the pool must not be the limit on concurrency.
    return aioredis.Redis.from_url(
        url,
        decode_responses=False,
        health_check_interval=30,
        max_connections=ASYNC_POOL_MAX,
        socket_timeout=SOCKET_TIMEOUT_S,
        # Pooled connections die with a Redis restart; reconnect and retry for a few
        # seconds (as the blocking client does by default) instead of failing the call.
        retry=AsyncRetry(ExponentialWithJitterBackoff(base=0.25, cap=2.0), RETRIES),
    )


def sync_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url, decode_responses=False, health_check_interval=30, socket_timeout=SOCKET_TIMEOUT_S
    )
