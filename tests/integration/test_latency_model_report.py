"""What a runner reports for the online latency model: each finished request's usage
record carries its queue wait (enqueue to claim, within its TTFT) and the mean number of
requests in its batch while it decoded (a serving loop, fake engine, real Redis)."""

from __future__ import annotations

import asyncio
import threading
import time

import msgspec
import pytest
import redis
from support import wait_until

from ebb.queue import keys
from ebb.queue.connection import async_client, sync_client
from ebb.queue.platform import PlatformState
from ebb.queue.requests import RequestQueue
from ebb.queue.runner_side import RunnerQueue
from ebb.queue.schema import (
    DeploymentSpec,
    RunnerRecord,
    RunnerState,
    SamplingSpec,
    UsageRecord,
    WorkItem,
)
from ebb.runners.engine import EngineOptions
from ebb.runners.lifecycle import Lifecycle
from ebb.runners.serve import ServingLoop
from ebb.testing.fake_engine import FakeEngine

pytestmark = pytest.mark.integration

SOURCE = "fake://latmodel?step_ms=2"
N = 3


async def _enqueue(url: str, spec: DeploymentSpec) -> None:
    client = async_client(url)
    await PlatformState(client).put_deployment(spec)
    queue = RequestQueue(client, request_ttl_s=60)
    for i in range(N):
        item = WorkItem(
            request_id=f"lm-{i}",
            deployment=spec.name,
            prompt_token_ids=[1, 2, 3],
            sampling=SamplingSpec(max_tokens=6, ignore_eos=True),
            enqueued_at_s=time.time(),
        )
        await queue.enqueue(item, admission_window_s=10, depth_limit=10)
    await client.aclose()


def test_usage_records_carry_queue_wait_and_mean_batch_size(redis_url):
    spec = DeploymentSpec(name="latmodel", source=SOURCE, created_at_s=time.time())
    asyncio.run(_enqueue(redis_url, spec))
    queue = RunnerQueue(sync_client(redis_url), "rlm", lease_ttl_s=30, result_ttl_s=60)
    queue.register(RunnerRecord(runner_id="rlm", state=RunnerState.READY, deployment=spec.name))
    engine = FakeEngine.load(EngineOptions(model_path=None, max_model_len=2048, source=SOURCE))
    stop = threading.Event()
    loop = ServingLoop(queue, engine, spec, stop, Lifecycle(queue, RunnerState.READY))
    runner = threading.Thread(target=loop.run)
    runner.start()
    r = redis.Redis.from_url(redis_url)
    try:
        wait_until(lambda: r.xlen(keys.USAGE) >= N, 20, "every request finished")
    finally:
        stop.set()
        runner.join(timeout=30)
    records = [msgspec.json.decode(f[b"r"], type=UsageRecord) for _, f in r.xrange(keys.USAGE)]
    mine = [u for u in records if u.deployment == spec.name]
    assert len(mine) == N
    for usage in mine:
        assert usage.queue_ms is not None and usage.ttft_ms is not None
        assert 0 <= usage.queue_ms <= usage.ttft_ms
        # Claimed together, the three decoded side by side.
        assert usage.batch_size == pytest.approx(N)
