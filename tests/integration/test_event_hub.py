"""The frontdoor's event hub: one XREAD follows the event streams of many requests, a
request followed while that XREAD blocks is read at once (CLIENT UNBLOCK), and a failed
read reaches the readers waiting on it, as EventReader's would."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis
from support import free_port

from ebb.queue import event_hub, keys
from ebb.queue.connection import async_client
from ebb.queue.event_hub import EventHub
from ebb.queue.schema import Claimed, Failed, Finished, encode

pytestmark = pytest.mark.integration


def xreads(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_xread", {}).get("calls", 0))


def add(r: redis.Redis, request_id: str, *events: object) -> None:
    for event in events:
        r.xadd(keys.events(request_id), {"e": encode(event)})


def test_one_read_serves_many_requests_in_order(redis_url):
    r = redis.Redis.from_url(redis_url)
    ids = [f"hub-many-{i}" for i in range(20)]
    for request_id in ids:
        add(r, request_id, Claimed(runner_id="r1"), Finished(prompt_tokens=1, completion_tokens=1))

    async def follow_all() -> list[list[object]]:
        client = async_client(redis_url)
        hub = EventHub(client)
        readers = [hub.reader(request_id) for request_id in ids]

        async def both(reader) -> list[object]:
            return [await reader.next(30), await reader.next(30)]

        try:
            return await asyncio.gather(*(both(reader) for reader in readers))
        finally:
            await client.aclose()

    before = xreads(r)
    results = asyncio.run(follow_all())
    assert all(
        events == [Claimed(runner_id="r1"), Finished(prompt_tokens=1, completion_tokens=1)]
        for events in results
    )
    assert xreads(r) - before < len(ids), "the requests' reads are shared"


def test_a_request_followed_while_the_read_blocks_is_read_at_once(redis_url, monkeypatch):
    # Without CLIENT UNBLOCK, the second reader would wait out the first's XREAD (an hour).
    monkeypatch.setattr(event_hub, "_BLOCK_S", 3600.0)
    r = redis.Redis.from_url(redis_url)

    async def late_follower() -> object:
        client = async_client(redis_url)
        hub = EventHub(client)
        waiting = asyncio.create_task(hub.reader("hub-quiet").next(3600))
        while not hub._blocked:  # the hub's XREAD is on its way
            await asyncio.sleep(0.01)
        add(r, "hub-late", Claimed(runner_id="r2"))
        try:
            return await hub.reader("hub-late").next(60)
        finally:
            waiting.cancel()
            await client.aclose()

    assert asyncio.run(late_follower()) == Claimed(runner_id="r2")


def test_a_reader_follows_again_after_a_failed_event(redis_url):
    """A Failed event unfollows; a rerun's next events are read when it asks again."""
    r = redis.Redis.from_url(redis_url)
    add(r, "hub-rerun", Claimed(runner_id="r1"), Failed(message="lost", code="runner_lost"))

    async def rerun() -> list[object]:
        client = async_client(redis_url)
        reader = EventHub(client).reader("hub-rerun")
        try:
            seen = [await reader.next(30), await reader.next(30)]
            add(r, "hub-rerun", Claimed(runner_id="r2"))
            return [*seen, await reader.next(30)]
        finally:
            await client.aclose()

    assert asyncio.run(rerun()) == [
        Claimed(runner_id="r1"),
        Failed(message="lost", code="runner_lost"),
        Claimed(runner_id="r2"),
    ]


def test_a_failed_read_reaches_the_waiting_reader():
    async def unreachable() -> None:
        client = aioredis.Redis(port=free_port(), retry=None)  # nothing listens there
        try:
            await EventHub(client).reader("hub-gone").next(30)
        finally:
            await client.aclose()

    with pytest.raises(redis.ConnectionError):
        asyncio.run(unreachable())
