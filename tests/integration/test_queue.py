"""The queue's atomic state changes against a real redis-server."""

from __future__ import annotations

import asyncio
import random
import threading

import msgspec
import pytest
import redis
from support import wait_until

from ebb.queue import keys
from ebb.queue.connection import async_client, sync_client
from ebb.queue.platform import PlatformState
from ebb.queue.requests import QueueFull, RequestQueue
from ebb.queue.runner_side import Ending, RunnerQueue
from ebb.queue.schema import (
    Claimed,
    Failed,
    Finished,
    Progress,
    SamplingSpec,
    UsageRecord,
    WorkItem,
    decode_event,
)

pytestmark = pytest.mark.integration

DEP = "dep-a"


def work(i: int | str) -> WorkItem:
    return WorkItem(
        request_id=f"req-{i}",
        deployment=DEP,
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingSpec(max_tokens=4),
    )


def runner_queue(url: str, runner_id: str, lease_ttl_s: float = 5.0) -> RunnerQueue:
    return RunnerQueue(sync_client(url), runner_id, lease_ttl_s=lease_ttl_s, result_ttl_s=60)


async def test_claim_withdraw_race_every_request_runs_once_or_is_refused(redis_url):
    """Many withdraws race many claims: each request is claimed xor withdrawn."""
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    items = [work(i) for i in range(400)]
    for item in items:
        await queue.enqueue(item, admission_window_s=60, depth_limit=10_000)

    claimed: dict[str, list[str]] = {}
    go, stop = threading.Event(), threading.Event()

    def claimer(runner_id: str) -> None:
        rq = runner_queue(redis_url, runner_id)
        mine = claimed.setdefault(runner_id, [])
        go.wait()
        while not stop.is_set():
            mine += [w.request_id for w in rq.claim(DEP, random.randint(1, 5)).claimed]

    threads = [threading.Thread(target=claimer, args=(f"r{i}",)) for i in range(4)]
    for t in threads:
        t.start()

    async def withdraw(item: WorkItem) -> bool:
        ok = await queue.withdraw(item)
        go.set()  # claimers start once withdraws are flowing, so the two interleave
        return ok

    order = random.sample(items, len(items))
    results = await asyncio.gather(*(withdraw(item) for item in order))
    withdrawn = dict(zip((i.request_id for i in order), results, strict=True))
    # Whatever the withdraws left in the queue is claimed before the claimers stop.
    wait_until(
        lambda: redis.Redis.from_url(redis_url).zcard(keys.queue(DEP)) == 0,
        10,
        "the queue to empty",
    )
    stop.set()
    for t in threads:
        t.join()

    all_claims = [rid for ids in claimed.values() for rid in ids]
    assert len(all_claims) == len(set(all_claims)), "a request was claimed twice"
    claimed_ids = set(all_claims)
    withdrawn_ids = {request_id for request_id, ok in withdrawn.items() if ok}
    assert not claimed_ids & withdrawn_ids, "a request was both claimed and withdrawn"
    assert claimed_ids | withdrawn_ids == {item.request_id for item in items}
    assert claimed_ids and withdrawn_ids, "the race did not interleave; make it harder"
    for item in items:
        state = (await queue.request_state(item.request_id))["state"]
        assert state == ("withdrawn" if withdrawn[item.request_id] else "claimed")
    await client.aclose()


async def test_claim_after_deadline_expires_the_request_instead(redis_url):
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    item = work("late")
    admission = await queue.enqueue(item, admission_window_s=0.05, depth_limit=10)
    r = redis.Redis.from_url(redis_url)
    wait_until(lambda: _redis_now_ms(r) > admission.deadline_ms, 5, "the deadline to pass")
    rq = runner_queue(redis_url, "r1")
    assert rq.claim(DEP, 1).claimed == []
    assert _state(redis_url, item) == "expired"
    assert await queue.withdraw(item), "an expired request must be withdrawable (503)"
    await client.aclose()


async def test_queue_full_refuses_at_once(redis_url):
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    await queue.enqueue(work(1), admission_window_s=10, depth_limit=2)
    await queue.enqueue(work(2), admission_window_s=10, depth_limit=2)
    with pytest.raises(QueueFull):
        await queue.enqueue(work(3), admission_window_s=10, depth_limit=2)
    assert await queue.depth(DEP) == 2
    await client.aclose()


async def test_an_enqueue_retried_after_redis_lost_its_reply_is_the_same_admission(redis_url):
    """The client library resends a script whose reply a Redis restart lost (its writes
    survived in the append-only file): the resend hears the first answer, even at a full
    queue, and the request is queued once. Another request under the same id is refused."""
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    first = await queue.enqueue(work("again"), admission_window_s=10, depth_limit=1)
    resent = await queue.enqueue(work("again"), admission_window_s=10, depth_limit=1)
    assert resent == first and first.deadline_ms > 0
    assert await queue.depth(DEP) == 1
    impostor = msgspec.structs.replace(work("again"), prompt_token_ids=[9])
    with pytest.raises(ValueError, match="already exists"):
        await queue.enqueue(impostor, admission_window_s=10, depth_limit=100)
    assert await queue.withdraw(work("again")) and await queue.withdraw(work("again"))
    assert await queue.depth(DEP) == 0
    await client.aclose()


async def test_the_controller_is_woken_only_for_a_request_no_claiming_runner_will_take(redis_url):
    """enqueue.lua wakes the controller when the queue stops being empty, unless a runner
    with room claims from it; a runner that fills up, drains, sleeps or stops lets the
    next request wake it again."""
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    r = redis.Redis.from_url(redis_url)

    async def wakes_controller(item: WorkItem) -> bool:
        r.delete(keys.WAKE)
        await queue.enqueue(item, admission_window_s=60, depth_limit=100)
        return r.lrange(keys.WAKE, 0, -1) == [DEP.encode()]

    assert await wakes_controller(work(1)), "no runner claims yet: a cold start"
    rq = runner_queue(redis_url, "r1")
    assert len(rq.claim(DEP, 4).claimed) == 1  # room for three more
    assert 0 < r.pttl(keys.claiming(DEP)) <= keys.CLAIMING_TTL_MS
    assert not await wakes_controller(work(2)), "the claiming runner takes it"
    assert len(rq.claim(DEP, 1).claimed) == 1  # and is full after it
    r.delete(keys.claiming(DEP))  # as if its marker had expired
    assert len(rq.claim(DEP, 0).claimed) == 0  # a full runner's claim sets no marker
    assert await wakes_controller(work(3))

    for leave in (
        lambda: rq.try_drain(DEP),
        lambda: rq.try_sleep(DEP),
        lambda: rq.stop_claiming(DEP),
    ):
        assert len(rq.claim(DEP, 4).claimed) == 1
        assert not await wakes_controller(work(f"beside-{id(leave)}"))
        assert len(rq.claim(DEP, 4).claimed) == 1  # the queue is empty again
        leave()
        assert await wakes_controller(work(f"after-{id(leave)}"))
    await client.aclose()


async def test_lease_expiry_ends_the_request_with_runner_lost(redis_url):
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    state = PlatformState(client)
    item = work("lost")
    await queue.enqueue(item, admission_window_s=10, depth_limit=10)
    rq = runner_queue(redis_url, "r-dead", lease_ttl_s=1.0)
    assert [w.request_id for w in rq.claim(DEP, 1).claimed] == [item.request_id]
    reader = queue.events(item.request_id)
    assert isinstance(await reader.next(1), Claimed)
    # The runner never heartbeats: its lease runs out and the reaper reports the loss.
    reaped: list[str] = []

    async def reap_until_expired():
        while item.request_id not in reaped:
            reaped.extend(await state.reap_expired_leases())
            await asyncio.sleep(0.05)

    await asyncio.wait_for(reap_until_expired(), 10)
    event = await reader.next(1)
    assert isinstance(event, Failed) and event.code == "runner_lost"
    # A late finish from the lost runner is refused: the client was already told.
    assert not rq.finish(
        item, state="finished", event=Finished(3, 4), prompt_tokens=3, completion_tokens=4
    )
    assert redis.Redis.from_url(redis_url).xlen(keys.USAGE) == 0
    await client.aclose()


async def test_a_lost_request_reruns_once_under_its_id_and_bills_once(redis_url):
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    state = PlatformState(client)
    item = work("rerun")
    await queue.enqueue(item, admission_window_s=10, depth_limit=10)
    dead = runner_queue(redis_url, "r-gone", lease_ttl_s=0.05)
    dead.claim(DEP, 1)
    # Not while Redis itself just started (nobody could heartbeat): then reaped.
    await asyncio.sleep(0.1)
    assert await state.reap_expired_leases(restart_grace_s=1e9) == []
    assert await state.reap_expired_leases() == [item.request_id]
    assert not await queue.rerun_lost(work("never-lost"), admission_window_s=10)
    assert await queue.rerun_lost(item, admission_window_s=10)
    assert not await queue.rerun_lost(item, admission_window_s=10), "queued, not lost"
    alive = runner_queue(redis_url, "r-next", lease_ttl_s=5)
    assert [w.request_id for w in alive.claim(DEP, 1).claimed] == [item.request_id]
    done = dict(state="finished", event=Finished(3, 4), prompt_tokens=3, completion_tokens=4)
    assert not dead.finish(item, **done), "the lost runner can no longer finish it"
    assert alive.finish(item, **done)
    assert redis.Redis.from_url(redis_url).xlen(keys.USAGE) == 1
    await client.aclose()


async def test_heartbeat_keeps_a_lease_alive(redis_url):
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    state = PlatformState(client)
    item = work("alive")
    await queue.enqueue(item, admission_window_s=10, depth_limit=10)
    rq = runner_queue(redis_url, "r-live", lease_ttl_s=1.0)
    rq.claim(DEP, 1)
    r = redis.Redis.from_url(redis_url)
    first_expiry = r.zscore(keys.LEASES, item.request_id)
    wait_until(
        lambda: (
            rq.heartbeat([item.request_id]) or r.zscore(keys.LEASES, item.request_id) > first_expiry
        ),
        5,
        "the lease to move",
    )
    assert item.request_id not in await state.reap_expired_leases()
    assert _state(redis_url, item) == "claimed"
    await client.aclose()


async def test_cancel_withdraws_queued_and_aborts_running(redis_url):
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    queued, running = work("q"), work("r")
    await queue.enqueue(running, admission_window_s=10, depth_limit=10)
    rq = runner_queue(redis_url, "r1")
    assert rq.claim(DEP, 1).claimed[0].request_id == running.request_id
    await queue.enqueue(queued, admission_window_s=10, depth_limit=10)

    assert await queue.cancel(queued) == "withdrawn"
    assert await queue.cancel(running) == "aborting"
    result = rq.claim(DEP, 5)
    assert result.claimed == [], "a cancelled queued request must never be claimed"
    assert result.cancelled == [running.request_id]
    assert rq.finish(
        running,
        state="cancelled",
        event=Failed("cancelled", "cancelled"),
        prompt_tokens=3,
        completion_tokens=2,
    )
    assert await queue.cancel(running) == "none"


async def test_finish_records_usage_exactly_once(redis_url):
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    item = work("once")
    await queue.enqueue(item, admission_window_s=10, depth_limit=10)
    rq = runner_queue(redis_url, "r1")
    rq.claim(DEP, 1)
    for _ in range(3):  # a retried finish (say, after a Redis timeout) bills nothing more
        rq.finish(
            item, state="finished", event=Finished(3, 4), prompt_tokens=3, completion_tokens=4
        )
    entries = redis.Redis.from_url(redis_url).xrange(keys.USAGE)
    assert len(entries) == 1
    record = msgspec.json.decode(entries[0][1][b"r"], type=UsageRecord)
    assert (record.request_id, record.prompt_tokens, record.completion_tokens) == (
        item.request_id,
        3,
        4,
    )
    reader = queue.events(item.request_id)
    events = [await reader.next(1) for _ in range(2)]
    assert isinstance(events[0], Claimed) and events[1] == Finished(3, 4)
    assert await reader.next(0.1) is None, "exactly one terminal event"
    await client.aclose()


def _state(url: str, item: WorkItem) -> str:
    raw = redis.Redis.from_url(url).hget(keys.request(item.request_id), "state")
    return raw.decode() if raw else ""


def _redis_now_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


async def test_one_round_trip_publishes_a_step_and_finishes_what_it_completed(redis_url):
    """Output and endings of one engine step go in one pipeline, after Redis forgot its
    scripts too (a restart): each request ends once, billed once, with its events in order."""
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    items = [work(f"step-{i}") for i in range(3)]
    for item in items:
        await queue.enqueue(item, admission_window_s=10, depth_limit=10)
    rq, other = runner_queue(redis_url, "r1"), runner_queue(redis_url, "r2")
    assert len(rq.claim(DEP, 3).claimed) == 3
    redis.Redis.from_url(redis_url).script_flush()  # NOSCRIPT for the pipelined finishes
    progress = {i.request_id: Progress(choices=[], seq=1) for i in items}
    endings = [Ending(i, "finished", Finished(3, 1), 3, 1) for i in items]
    assert rq.publish(progress, endings) == [True, True, True]
    assert other.finish_many(endings[:2]) == [False, False], "not r2's to finish"
    r = redis.Redis.from_url(redis_url)
    assert len(r.xrange(keys.USAGE)) == 3
    for item in items:
        kinds = [
            type(decode_event(f[b"e"])).__name__ for _, f in r.xrange(keys.events(item.request_id))
        ]
        assert kinds == ["Claimed", "Progress", "Finished"]
    await client.aclose()
