"""The GPU split through the real meter_gpu.lua, ledger consumer and reconcile (real Redis):
a segment carries the runner's account by use, the aggregates' uses add up to `gpu_ms`
exactly, and reconcile reports an hour whose uses do not (drift where "split")."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from ebb.billing.consumer import LedgerConsumer
from ebb.billing.reconcile import reconcile
from ebb.queue import keys
from ebb.queue.ledger import LedgerStore
from ebb.queue.metering import GpuMeter, GpuMeterScript

pytestmark = pytest.mark.integration

USE_METRICS = ("gpu_serving_ms", "gpu_loading_ms", "gpu_idle_ms", "gpu_asleep_ms", "gpu_wasted_ms")


@pytest.fixture
async def client(redis_url):
    c = aioredis.Redis.from_url(redis_url)
    yield c
    await c.aclose()


async def test_segments_carry_their_uses_and_reconcile_checks_they_add_up(client):
    now_ms = await LedgerStore(client).redis_now_ms()
    launched = now_ms - 10_007
    await client.hset(keys.runner("r-1"), mapping={"launched_ms": launched})
    script = GpuMeterScript(client)
    meter = GpuMeter(runner_id="r-1", deployment="m", tenant="acme", gpu_count=3)
    await script.switch("r-1", meter, end=0)  # who pays, stored at launch
    uses = {"loading": 2_000, "serving": 5_000, "idle": 3_001}
    assert await script.switch("r-1", meter, end=launched + 6_001, uses_ms=uses) == 6_001
    assert await script.close("r-1", meter, end=now_ms) == 4_006  # no account: wasted
    store = LedgerStore(client)
    await LedgerConsumer(store, grace_s=3600).drain()
    sums: dict[str, int] = {}
    for counts in (await store.aggregates()).values():
        for name, n in counts.items():
            metric = name.split("|")[2]
            sums[metric] = sums.get(metric, 0) + n
    assert sums["gpu_ms"] == 10_007 * 3
    assert sum(sums.get(m, 0) for m in USE_METRICS) == sums["gpu_ms"]
    assert sums["gpu_wasted_ms"] == 4_006 * 3
    assert sums["gpu_serving_ms"] > sums["gpu_idle_ms"] > sums["gpu_loading_ms"] > 0
    assert (await reconcile(store)).ok
    # (The segment may span an hour's turn: any hour holding idle time will do.)
    hour = next(h for h, c in (await store.aggregates()).items() if "acme|m|gpu_idle_ms" in c)
    await client.hincrby(keys.ledger_aggregates(hour), "acme|m|gpu_idle_ms", 1)
    result = await reconcile(store)
    assert ("acme|m|gpu_ms_by_use", "split") in {(d.field, d.where) for d in result.drift}
