"""Claiming prefers a base's runner that already holds a request's LoRA adapter, against a
real redis-server: an adapter's request is left for the runner that last claimed one of
that adapter (within the prefix-affinity wait), whatever its prompt."""

from __future__ import annotations

import pytest
import redis
from support import wait_until
from support.claiming import enqueue

from ebb.queue.connection import sync_client
from ebb.queue.runner_side import RunnerQueue
from ebb.queue.schema import AdapterRef, RunnerRecord, RunnerState, SamplingSpec, WorkItem

pytestmark = pytest.mark.integration

BASE = "lora-claim-base"
ADAPTER = AdapterRef(name="ad", uid="dep_ad", source="/adapters/ad")


def work(name: str, adapter: AdapterRef | None) -> WorkItem:
    return WorkItem(
        request_id=f"req-{name}",
        deployment=BASE,
        prompt_token_ids=[len(name), 2, 3],  # short: no prompt prefix to match by
        sampling=SamplingSpec(max_tokens=4),
        adapter=adapter,
    )


def runner(url: str, runner_id: str, affinity_ms: int) -> RunnerQueue:
    rq = RunnerQueue(
        sync_client(url),
        runner_id,
        lease_ttl_s=5.0,
        result_ttl_s=60,
        prefix_affinity_ms=affinity_ms,
        prefix_step_wait_ms=0,
    )
    seconds, micros = redis.Redis.from_url(url).time()
    rq.register(
        RunnerRecord(
            runner_id=runner_id,
            state=RunnerState.READY,
            deployment=BASE,
            heartbeat_ms=seconds * 1000 + micros // 1000,
        )
    )
    return rq


def claimed(rq: RunnerQueue) -> list[str]:
    return [w.request_id for w in rq.claim(BASE, 4).claimed]


async def test_an_adapters_request_is_left_for_the_runner_holding_it(redis_url, queue):
    a, b = runner(redis_url, "ra", 10_000), runner(redis_url, "rb", 10_000)
    await enqueue(queue, work("first", ADAPTER))
    assert claimed(a) == ["req-first"]  # a now holds the adapter
    await enqueue(queue, work("again", ADAPTER), work("plain", None))
    assert claimed(b) == ["req-plain"]  # the adapter's request waits for a
    assert claimed(a) == ["req-again"]


async def test_past_the_affinity_wait_any_runner_takes_it(redis_url, queue):
    a, b = runner(redis_url, "ra", 200), runner(redis_url, "rb", 200)
    await enqueue(queue, work("first", ADAPTER))
    assert claimed(a) == ["req-first"]
    await enqueue(queue, work("late", ADAPTER))
    wait_until(lambda: claimed(b) == ["req-late"], 10, "b to take the adapter's request")
