"""GPU-time metering (lua/meter_gpu.lua) and rate-limit buckets (lua/ratelimit.lua) on a
real Redis."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.metering import (
    LAST_SIGN_OF_LIFE,
    GpuMeter,
    GpuMeterScript,
    GpuSegment,
    decode_gpu_entry,
)
from ebb.queue.ratelimits import RateLimits, RateLimitStore, key_subject, tenant_subject

pytestmark = pytest.mark.integration

LAUNCHED_MS = 1_700_000_000_000


@pytest.fixture
def sync_redis(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.hset(keys.runner("r-1"), mapping={"runner_id": "r-1", "launched_ms": LAUNCHED_MS})
    yield client
    client.close()


def meter(deployment: str, price: int = 0) -> GpuMeter:
    return GpuMeter(
        runner_id="r-1", deployment=deployment, tenant="t", price_per_gpu_second_micros=price
    )


def segments(client) -> list[GpuSegment]:
    return [decode_gpu_entry(fields) for _, fields in client.xrange(keys.GPU_USAGE)]


def heartbeat(client, at_ms: int) -> None:
    client.hset(keys.runner("r-1"), "heartbeat_ms", at_ms)


def test_a_runners_life_is_metered_without_gap_or_overlap(sync_redis):
    script = GpuMeterScript(sync_redis)
    # Started as a pre-warmed runner: nothing to meter before its first heartbeat.
    assert script.switch("r-1", meter("(pool)"), end="heartbeat_ms") == 0
    heartbeat(sync_redis, LAUNCHED_MS + 1_500)
    assert script.switch("r-1", meter("m", price=5), end="heartbeat_ms") == 1_500
    heartbeat(sync_redis, LAUNCHED_MS + 4_000)
    assert script.switch("r-1", meter("m", price=6), end="heartbeat_ms") == 2_500
    heartbeat(sync_redis, LAUNCHED_MS + 4_700)
    # SIGKILLed: the controller closes from the last heartbeat, with a fallback it ignores.
    assert script.close("r-1", meter("ignored"), end="heartbeat_ms") == 700
    assert script.close("r-1", meter("m"), end="heartbeat_ms") == -1
    assert script.switch("r-1", meter("m"), end=LAUNCHED_MS + 9_000) == -1
    got = segments(sync_redis)
    assert [(s.start_ms, s.end_ms) for s in got] == [
        (LAUNCHED_MS, LAUNCHED_MS + 1_500),
        (LAUNCHED_MS + 1_500, LAUNCHED_MS + 4_000),
        (LAUNCHED_MS + 4_000, LAUNCHED_MS + 4_700),
    ]
    assert [s.meter.deployment for s in got] == ["(pool)", "m", "m"]
    assert [s.meter.price_per_gpu_second_micros for s in got] == [0, 5, 6]


def test_closing_without_a_known_end_waits_for_one(sync_redis):
    script = GpuMeterScript(sync_redis)
    assert script.close("r-1", meter("m"), end="exited_ms") == -2
    sync_redis.hset(keys.runner("r-1"), "exited_ms", LAUNCHED_MS + 3_000)
    # Never past the recorded exit, and the fallback attribution applies (none was stored).
    assert script.close("r-1", meter("m"), end=LAUNCHED_MS + 60_000) == 3_000
    [only] = segments(sync_redis)
    assert only.meter.deployment == "m" and only.end_ms == LAUNCHED_MS + 3_000


def test_a_runner_killed_before_its_first_heartbeat_ends_where_last_seen(sync_redis):
    script = GpuMeterScript(sync_redis)
    script.switch("r-1", meter("m"), end="heartbeat_ms")
    sync_redis.hset(keys.runner("r-1"), "ready_ms", LAUNCHED_MS + 800)
    assert script.close("r-1", meter("m"), end=LAST_SIGN_OF_LIFE) == 800


@pytest.fixture
async def limits(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    yield RateLimitStore(client)
    await client.aclose()


async def test_no_limit_no_bucket(limits):
    assert (await limits.reserve("key_a", "acme", 10)).status == "none"


async def test_requests_per_minute(limits):
    await limits.set_limits(key_subject("key_a"), RateLimits(requests_per_minute=2))
    assert [(await limits.reserve("key_a", "acme", 10)).status for _ in range(2)] == ["ok"] * 2
    refused = await limits.reserve("key_a", "acme", 10)
    assert (refused.status, refused.subject, refused.kind) == ("limited", "key:key_a", "rpm")
    assert 0 < refused.wait_ms <= 30_000  # one request refills in 60 s / 2
    # A request that never ran gives its request back.
    await limits.adjust("key_a", "acme", requests=1, tokens=10)
    assert (await limits.reserve("key_a", "acme", 10)).status == "ok"


async def test_tokens_per_minute_reserve_and_settle(limits):
    await limits.set_limits(tenant_subject("acme"), RateLimits(tokens_per_minute=100))
    await limits.set_limits(key_subject("key_a"), RateLimits(requests_per_minute=1000))
    assert (await limits.reserve("key_a", "acme", 60)).status == "ok"
    refused = await limits.reserve("key_b", "acme", 60)  # another key of the same tenant
    assert (refused.status, refused.subject, refused.kind) == ("limited", "tenant:acme", "tpm")
    # The first request used 10 of its 60 tokens: settling gives 50 back.
    await limits.adjust("key_a", "acme", requests=0, tokens=50)
    assert (await limits.reserve("key_b", "acme", 60)).status == "ok"
    too_large = await limits.reserve("key_a", "acme", 101)
    assert (too_large.status, too_large.limit) == ("too_large", 100)


async def test_a_refused_reservation_takes_nothing(limits):
    await limits.set_limits(key_subject("key_a"), RateLimits(requests_per_minute=2))
    await limits.set_limits(tenant_subject("acme"), RateLimits(tokens_per_minute=50))
    assert (await limits.reserve("key_a", "acme", 40)).status == "ok"
    assert (await limits.reserve("key_a", "acme", 40)).status == "limited"  # tokens
    # The refused one did not use the key's second request.
    assert (await limits.reserve("key_a", "acme", 5)).status == "ok"
    assert await limits.all_limits() == {
        "key:key_a": RateLimits(requests_per_minute=2),
        "tenant:acme": RateLimits(tokens_per_minute=50),
    }
