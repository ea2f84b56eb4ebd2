"""Least-loaded claiming against a real redis-server: a runner that would hold more than
a live, ready peer of its deployment with room (by more than one request) leaves the
request for that peer and wakes it, never past the balance wait; a lone runner, a silent,
full or draining peer, a critical request and a prefix the runner served last are never
left. Through the platform, concurrent requests are spread over two runners."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

import httpx
import pytest
import redis
from support import deploy, deployment, wait_until
from support.claiming import enqueue

from ebb.queue import keys
from ebb.queue.claim_balance import leaves_for_peer
from ebb.queue.connection import sync_client
from ebb.queue.prefix import PREFIX_TOKENS
from ebb.queue.runner_side import RunnerQueue
from ebb.queue.schema import RunnerRecord, RunnerState, SamplingSpec, WorkItem

pytestmark = pytest.mark.integration

DEP = "dep-bal"
SLOTS = 8
SYSTEM = list(range(1000, 1000 + PREFIX_TOKENS))


def work(name: str, prompt: list[int] | None = None, priority: str | None = None) -> WorkItem:
    return WorkItem(
        request_id=f"req-{name}",
        deployment=DEP,
        prompt_token_ids=prompt or [1, 2, 3],
        sampling=SamplingSpec(max_tokens=4),
        **({"priority": priority} if priority else {}),
    )


def runner(url: str, runner_id: str, wait_ms: int = 10_000, affinity_ms: int = 0) -> RunnerQueue:
    rq = RunnerQueue(
        sync_client(url),
        runner_id,
        lease_ttl_s=5.0,
        result_ttl_s=60,
        prefix_affinity_ms=affinity_ms,
        balance_wait_ms=wait_ms,
    )
    rq.register(RunnerRecord(runner_id=runner_id, state=RunnerState.READY, deployment=DEP))
    rq.claim(DEP, SLOTS)  # idle: it claims (finding nothing), so its peers know its room
    return rq


def claimed_ids(rq: RunnerQueue, count: int = SLOTS) -> list[str]:
    return [w.request_id for w in rq.claim(DEP, count).claimed]


async def test_a_burst_is_split_between_two_runners_with_room(redis_url, queue):
    a, b = runner(redis_url, "ra"), runner(redis_url, "rb")
    await enqueue(queue, *(work(str(i)) for i in range(SLOTS)))
    assert len(claimed_ids(a)) == SLOTS // 2  # the rest is left for b...
    r = redis.Redis.from_url(redis_url)
    assert r.llen(keys.runner_signal("rb")) == 1  # ...which is woken for it
    assert len(claimed_ids(b)) == SLOTS // 2


async def test_a_runner_with_more_room_than_its_peers_takes_all(redis_url, queue):
    a, b = runner(redis_url, "ra"), runner(redis_url, "rb")
    b.claim(DEP, 2)  # b holds 6 of 8
    await enqueue(queue, *(work(str(i)) for i in range(5)))
    assert len(claimed_ids(a)) == 5  # a holds 5, b 6


async def test_no_request_waits_past_the_balance_wait(redis_url, queue):
    wait_ms = 300
    a, _ = runner(redis_url, "ra", wait_ms), runner(redis_url, "rb", wait_ms)
    await enqueue(queue, *(work(str(i)) for i in range(4)))
    assert claimed_ids(a) == ["req-0", "req-2"]  # one each way: 1 and 3 are b's
    # b never claims (inside a long step, say): a takes the rest once they waited enough.
    late: list[str] = []
    wait_until(
        lambda: late.extend(claimed_ids(a, SLOTS - 2 - len(late))) or len(late) == 2,
        10,
        "a to take the rest",
    )
    assert sorted(late) == ["req-1", "req-3"]
    r = redis.Redis.from_url(redis_url)
    for i in (1, 3):
        enqueued, claimed, by = r.hmget(
            keys.request(f"req-{i}"), "enqueued_ms", "claimed_ms", "runner"
        )
        assert by == b"ra" and int(claimed) - int(enqueued) >= wait_ms


async def test_requests_left_for_a_peer_are_not_counted_as_waiting_for_this_runner(
    redis_url, queue
):
    # A runner full of jobs gives one back when synchronous requests wait for it
    # (job_yield.lua): not for those its claim left for a peer with room.
    a, _ = runner(redis_url, "ra"), runner(redis_url, "rb")
    await enqueue(queue, *(work(str(i)) for i in range(SLOTS)))
    result = a.claim(DEP, SLOTS)
    assert len(result.claimed) == SLOTS // 2
    assert result.sync_waiting == 0  # the other half is b's
    r = redis.Redis.from_url(redis_url)
    assert r.zcard(keys.queue(DEP)) == SLOTS // 2  # still queued, for b


@pytest.mark.parametrize("peer_is", ["absent", "full", "draining", "silent", "off"])
async def test_a_peer_that_cannot_take_it_is_not_waited_for(redis_url, queue, peer_is):
    a = runner(redis_url, "ra")
    if peer_is != "absent":
        b = runner(redis_url, "rb", wait_ms=0 if peer_is == "off" else 10_000)
        if peer_is == "full":
            b.claim(DEP, 0)
        elif peer_is == "draining":
            b.set_fields(state=RunnerState.DRAINING)
        elif peer_is == "silent":  # its last claim is older than a lease
            redis.Redis.from_url(redis_url).zadd(keys.claimers(DEP), {"rb": 1})
    await enqueue(queue, *(work(str(i)) for i in range(4)))
    assert len(claimed_ids(a)) == 4


async def test_critical_requests_and_a_prefix_the_runner_holds_are_not_left(redis_url, queue):
    a = runner(redis_url, "ra", affinity_ms=10_000)
    await enqueue(queue, work("first", SYSTEM + [1]))
    assert claimed_ids(a) == ["req-first"]  # a holds the system prompt's prefix
    runner(redis_url, "rb", affinity_ms=10_000)
    await enqueue(
        queue,
        work("c1", priority="critical"),
        work("c2", priority="critical"),
        work("same", SYSTEM + [2]),
        work("plain"),
    )
    # a holds 1; it takes both critical ones and its prefix's: 4 against b's 0.
    assert sorted(claimed_ids(a, SLOTS - 1)) == ["req-c1", "req-c2", "req-same"]


def mirrored_claim(held: int, peer_held: int, queued: int) -> int:
    """How many of `queued` fresh requests a runner holding `held` takes beside a peer
    holding `peer_held`, by the simulator's rule (`leaves_for_peer`)."""
    taken = left = 0
    for _ in range(queued):
        if held + taken >= SLOTS:
            break
        if leaves_for_peer(
            held_after=held + taken + 1,
            peer_held=peer_held + left,
            peer_room=SLOTS - peer_held - left,
            waited_ms=0,
            wait_ms=10_000,
        ):
            left += 1
        else:
            taken += 1
    return taken


async def test_the_simulators_rule_takes_what_claim_lua_takes(redis_url, queue):
    r = redis.Redis.from_url(redis_url)
    for held, peer_held, queued in itertools.product(range(0, 9, 2), range(0, 9, 2), (1, 3, 6)):
        r.flushall()
        a, b = runner(redis_url, "ra"), runner(redis_url, "rb")
        b.claim(DEP, SLOTS - peer_held)  # its room, as its last claim left it
        await enqueue(queue, *(work(str(i)) for i in range(queued)))
        taken = len(claimed_ids(a, SLOTS - held))
        assert taken == mirrored_claim(held, peer_held, queued), (held, peer_held, queued)


def test_through_the_platform_requests_are_spread_over_busy_runners(platform, admin):
    """Two ready runners of one deployment serving two requests, and a burst of six
    more: neither ends up with more than one request more than the other (racing, the
    runner whose engine step ended first took most of the burst)."""
    deploy(
        admin,
        "bal",
        source="fake://m?step_ms=40",
        min_replicas=2,
        max_replicas=2,
        max_concurrency=SLOTS,
    )
    wait_until(lambda: deployment(admin, "bal")["replicas"]["ready"] == 2, 60, "two ready runners")
    r = platform.redis()

    def rooms() -> list[int]:
        ids = [i.decode() for i in r.smembers(keys.RUNNERS)]
        fields = [r.hmget(keys.runner(i), "deployment", "state", "free_slots") for i in ids]
        return [int(f[2] or 0) for f in fields if f[:2] == [b"bal", b"ready"]]

    wait_until(lambda: rooms() == [SLOTS, SLOTS], 30, "both runners claiming, with room")
    body = {"model": "bal", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}

    async def burst(n: int) -> list[str]:
        async with httpx.AsyncClient(base_url=platform.base_url, timeout=120) as client:
            headers = {"Authorization": f"Bearer {platform.admin_key}"}
            posts = [
                client.post("/v1/chat/completions", json=body, headers=headers) for _ in range(n)
            ]
            replies = await asyncio.gather(*posts)
        return [reply.json()["id"] for reply in replies]

    async def scenario() -> list[str]:
        first = asyncio.ensure_future(burst(2))
        held = 2 * SLOTS - 2
        await asyncio.to_thread(wait_until, lambda: sum(rooms()) == held, 30, "both claimed")
        second = await burst(6)
        return await first + second

    ids = asyncio.run(scenario())
    per_runner = Counter(r.hget(keys.request(i), "runner") for i in ids)
    assert sorted(per_runner.values()) == [4, 4], per_runner
