"""Redis clients for the two sides: asyncio (frontdoor, controller) and blocking (runner)."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, ExponentialWithJitterBackoff
from redis.retry import Retry

from ebb import backoff
from ebb.queue.command_packing import with_fast_packing

# What a call raises when Redis cannot answer now (down, restarting, loading its
# append-only file, out of memory) rather than because the call was wrong: callers answer
# "unavailable, retry" (503) or ride it out, never "internal error".
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,  # BusyLoadingError, AuthenticationError among them
    redis.TimeoutError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.TryAgainError,
)

# In-flight requests one frontdoor process can follow at once.
ASYNC_POOL_MAX = 8192
# A reply slower than this means Redis is gone. Every blocking command (BLPOP, XREAD
# BLOCK) blocks for at most MAX_BLOCK_S, well inside it.
SOCKET_TIMEOUT_S = 30.0
MAX_BLOCK_S = 5.0
RETRIES = 4


# Connections a frontdoor process opens for the short reads every request makes before it
# is queued (admission's pipeline): requests wait a moment for one instead of each
# opening its own. A burst of 200 refusals at a process whose pool had grown only to its
# usual concurrency spent most of its time connecting (p99 0.53 s, 0.11 s once warm).
SHORT_POOL_MAX = 32
# Their name in CLIENT LIST, so that an operator can tell them from the blocking readers.
SHORT_CLIENT_NAME = "ebb-short"


def _async_options() -> dict[str, Any]:
    """What every asyncio pool's connections share."""
    return {
        "decode_responses": False,
        "health_check_interval": 30,
        "socket_timeout": SOCKET_TIMEOUT_S,
        # Pooled connections die with a Redis restart; reconnect and retry for a few
        # seconds (as the blocking client does by default) instead of failing the call.
        "retry": AsyncRetry(ExponentialWithJitterBackoff(base=0.25, cap=2.0), RETRIES),
    }


def async_client(url: str) -> aioredis.Redis:
    # Blocking reads (XREAD BLOCK per in-flight request) each hold a pooled connection,
    # so the pool must not be the limit on concurrency.
    client = aioredis.Redis.from_url(url, max_connections=ASYNC_POOL_MAX, **_async_options())
    with_fast_packing(client.connection_pool)
    return client


def short_command_client(url: str) -> aioredis.Redis:
    """An asyncio client for commands that answer at once (no blocking reads), on a pool
    of at most SHORT_POOL_MAX connections that callers wait for (a reply slower than
    SOCKET_TIMEOUT_S means Redis is gone all the same)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=SHORT_POOL_MAX,
        client_name=SHORT_CLIENT_NAME,
        timeout=SOCKET_TIMEOUT_S,
        **_async_options(),
    )
    return aioredis.Redis.from_pool(with_fast_packing(pool))  # closing it closes its pool


# The runner's waits between attempts while Redis is unreachable: short at first (a
# supervised restart takes well under a second), then at most this.
_SYNC_BACKOFF_BASE_S = 0.05
_SYNC_BACKOFF_CAP_S = 1.0


def retries_for(outage_s: float, base_s: float, cap_s: float) -> int:
    """How many doubling waits (base_s, 2*base_s, ... at most cap_s) add up to outage_s."""
    retries, waited_s = 0, 0.0
    while waited_s < outage_s:
        retries += 1
        # redis-py's ExponentialBackoff waits base_s * 2**retries before retry `retries`.
        waited_s += backoff.delay_s(retries + 1, first_s=base_s, cap_s=cap_s)
    return retries


def sync_client(url: str, *, outage_s: float = 30.0) -> redis.Redis:
    """A blocking client that rides out about `outage_s` of unreachable Redis per command
    (reconnecting, with backoff), then raises redis.ConnectionError.

    A retried write whose first try reached Redis before the connection broke runs
    twice: finishing checks state first (a no-op the second time), a streamed output
    event can repeat, and requests of a claim whose reply was lost are left to the lease
    reaper (requeued or rerun)."""
    retry = Retry(
        ExponentialBackoff(cap=_SYNC_BACKOFF_CAP_S, base=_SYNC_BACKOFF_BASE_S),
        retries_for(outage_s, _SYNC_BACKOFF_BASE_S, _SYNC_BACKOFF_CAP_S),
    )
    return redis.Redis.from_url(
        url,
        decode_responses=False,
        health_check_interval=30,
        socket_timeout=SOCKET_TIMEOUT_S,
        retry=retry,
    )
