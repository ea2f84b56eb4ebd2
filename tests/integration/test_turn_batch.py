"""Commands of one event-loop turn share a pipeline: each caller gets its own reply or
error, and a batched script still recovers from a Redis that lost its scripts."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.exceptions import ResponseError

from ebb.queue.connection import async_client
from ebb.queue.platform import PlatformState
from ebb.queue.schema import ApiKeyRecord
from ebb.queue.scripts import register_async
from ebb.queue.turn_batch import TurnBatch

pytestmark = pytest.mark.integration


def test_commands_of_one_turn_share_a_round_trip_and_keep_their_own_replies(redis_url):
    r = redis.Redis.from_url(redis_url)
    r.set("tb-a", "1")
    r.set("tb-b", "2")

    async def together() -> list[object]:
        client = async_client(redis_url)
        batch = TurnBatch(client)
        alone = client.execute_command

        async def sent_alone(*args, **kwargs):
            singles.append(args)
            return await alone(*args, **kwargs)

        client.execute_command = sent_alone  # type: ignore[method-assign]
        try:
            return await asyncio.gather(
                batch.execute("GET", "tb-a"),
                batch.execute("INCR", "tb-b"),
                batch.execute("HGET", "tb-a", "f"),  # wrong type: this one's error only
                return_exceptions=True,
            )
        finally:
            await client.aclose()

    singles: list[tuple] = []
    a, b, wrong = asyncio.run(together())
    assert singles == [], "the three went out as one pipeline"
    assert (a, b) == (b"1", 3)
    assert isinstance(wrong, ResponseError)


def test_a_batched_script_loads_itself_again_after_a_script_flush(redis_url):
    r = redis.Redis.from_url(redis_url)

    async def enqueue_twice() -> list[object]:
        client = async_client(redis_url)
        script = register_async(client, "ratelimit", TurnBatch(client))
        args = ["key:k", "tenant:t", "reserve", 1, 1, 60]
        keys = ["tb-limits", "tb-bucket-k", "tb-bucket-t"]
        try:
            first = await script(keys=keys, args=args)
            r.script_flush()
            return [first, await script(keys=keys, args=args)]
        finally:
            await client.aclose()

    first, second = asyncio.run(enqueue_twice())
    assert first == second == [b"none"]


def test_api_key_lookups_of_one_turn_share_a_round_trip_and_see_revocation(redis_url):
    async def lookups() -> list[object]:
        client = async_client(redis_url)
        state = PlatformState(client)
        await state.create_api_key("sk-one", ApiKeyRecord(key_id="k1", tenant="t1"))
        await state.create_api_key("sk-two", ApiKeyRecord(key_id="k2", tenant="t2"))
        sent_alone: list[tuple] = []
        alone = client.execute_command

        async def spy(*args, **kwargs):
            sent_alone.append(args)
            return await alone(*args, **kwargs)

        client.execute_command = spy  # type: ignore[method-assign]
        try:
            found = await asyncio.gather(
                *(state.lookup_api_key(s) for s in ("sk-one", "sk-two", "sk-none"))
            )
            client.execute_command = alone  # type: ignore[method-assign]
            await state.revoke_api_key("k1")
            return [
                [r and (r.key_id, r.revoked) for r in found],
                sent_alone,
                (await state.lookup_api_key("sk-one")).revoked,
            ]
        finally:
            await client.aclose()

    found, sent_alone, revoked_now = asyncio.run(lookups())
    assert found == [("k1", False), ("k2", False), None]
    assert sent_alone == [], "the three lookups went out as one pipeline"
    assert revoked_now is True, "nothing is cached: a revoked key is refused at once"
