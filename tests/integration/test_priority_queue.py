"""Priority classes in the queue (real redis-server): claims take critical work before
standard before sheddable, a sheddable request is shed once its queue is saturated, and
a request queued again after its runner was lost keeps its class."""

from __future__ import annotations

import pytest

from ebb.queue import keys
from ebb.queue.connection import async_client, sync_client
from ebb.queue.platform import PlatformState
from ebb.queue.requests import QueueShed, RequestQueue
from ebb.queue.runner_side import RunnerQueue
from ebb.queue.schema import SamplingSpec, WorkItem

pytestmark = pytest.mark.integration

DEP = "prio-dep"


def work(name: str, priority: str) -> WorkItem:
    return WorkItem(
        request_id=name,
        deployment=DEP,
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingSpec(max_tokens=4),
        priority=priority,
    )


async def test_claims_take_critical_then_standard_then_sheddable_oldest_first(redis_url):
    queue = RequestQueue(async_client(redis_url), request_ttl_s=60)
    # Queued least urgent first, so that enqueue order alone would claim them backwards.
    for name, priority in [
        ("shed-1", "sheddable"),
        ("std-1", "standard"),
        ("shed-2", "sheddable"),
        ("crit-1", "critical"),
        ("std-2", "standard"),
        ("crit-2", "critical"),
    ]:
        await queue.enqueue(work(name, priority), admission_window_s=60, depth_limit=100)
    runner = RunnerQueue(sync_client(redis_url), "r1", lease_ttl_s=5, result_ttl_s=60)
    order = [w.request_id for _ in range(6) for w in runner.claim(DEP, 1).claimed]
    assert order == ["crit-1", "crit-2", "std-1", "std-2", "shed-1", "shed-2"]


async def test_a_sheddable_request_is_shed_once_the_queue_holds_its_shed_depth(redis_url):
    queue = RequestQueue(async_client(redis_url), request_ttl_s=60)
    for i in range(2):
        await queue.enqueue(work(f"std-{i}", "standard"), admission_window_s=60, depth_limit=4)
    with pytest.raises(QueueShed):
        await queue.enqueue(
            work("shed", "sheddable"), admission_window_s=60, depth_limit=4, shed_depth=2
        )
    # Nothing of it was written: it did no work and costs nothing.
    client = sync_client(redis_url)
    assert not client.exists(keys.request("shed"))
    # Standard work is still admitted up to the queue's limit.
    await queue.enqueue(work("std-2", "standard"), admission_window_s=60, depth_limit=4)
    assert client.zcard(keys.queue(DEP)) == 3


async def test_the_controller_sees_the_most_urgent_class_and_the_oldest_wait(redis_url):
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    await queue.enqueue(work("shed-old", "sheddable"), admission_window_s=60, depth_limit=100)
    await queue.enqueue(work("crit-new", "critical"), admission_window_s=60, depth_limit=100)
    state = PlatformState(client, result_ttl_s=60)
    # Make the sheddable one 30 s old: the snapshot's wait is the oldest request's.
    raw = sync_client(redis_url)
    raw.zincrby(keys.queue(DEP), -30_000, "shed-old")
    snapshot = await state.queue_snapshot(DEP)
    assert snapshot.depth == 2
    assert snapshot.head_priority == "critical"
    assert 29 < snapshot.oldest_wait_s < 60


async def test_a_request_whose_runner_was_lost_goes_back_in_its_class(redis_url):
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    await queue.enqueue(work("crit", "critical"), admission_window_s=60, depth_limit=100)
    lost = RunnerQueue(sync_client(redis_url), "lost", lease_ttl_s=5, result_ttl_s=60)
    assert [w.request_id for w in lost.claim(DEP, 1).claimed] == ["crit"]
    await queue.enqueue(work("std", "standard"), admission_window_s=60, depth_limit=100)
    # The lost runner's lease expires; the reaper queues its request again as a
    # continuation (see reap.lua), in its class: it is claimed before the standard one.
    raw = sync_client(redis_url)
    raw.zadd(keys.LEASES, {"crit": 0})
    reaper = PlatformState(client, continuations=1, continuation_window_s=60)
    assert await reaper.reap_expired_leases() == ["crit"]
    other = RunnerQueue(sync_client(redis_url), "other", lease_ttl_s=5, result_ttl_s=60)
    assert [w.request_id for w in other.claim(DEP, 1).claimed] == ["crit"]


async def test_a_full_runner_still_takes_critical_work_but_nothing_else(redis_url):
    queue = RequestQueue(async_client(redis_url), request_ttl_s=60)
    for name, priority in [("std-1", "standard"), ("shed-1", "sheddable"), ("std-2", "standard")]:
        await queue.enqueue(work(name, priority), admission_window_s=60, depth_limit=100)
    runner = RunnerQueue(sync_client(redis_url), "r1", lease_ttl_s=5, result_ttl_s=60)
    assert [w.request_id for w in runner.claim(DEP, 1).claimed] == ["std-1"]
    # Its one slot is taken: beyond it, only critical requests, and none waits yet.
    assert runner.claim(DEP, 0, critical_extra=1).claimed == []
    await queue.enqueue(work("crit", "critical"), admission_window_s=60, depth_limit=100)
    await queue.enqueue(work("crit-2", "critical"), admission_window_s=60, depth_limit=100)
    assert [w.request_id for w in runner.claim(DEP, 0, critical_extra=1).claimed] == ["crit"]
    assert sync_client(redis_url).zcard(keys.queue(DEP)) == 3
