"""The stored responses' per-tenant caps on a real Redis (ebb.queue.response_store and its
scripts): room is taken atomically, counted at the stored size, given back on delete and
on expiry; a tenant's caps are its own. And the high-water reading every tenant-fed store
asks (ebb.queue.memory_headroom)."""

from __future__ import annotations

import asyncio

import pytest
import redis

from ebb.queue import response_store
from ebb.queue.connection import async_client
from ebb.queue.memory_headroom import RedisHeadroom
from ebb.queue.response_store import CapUse, ResponseStore, StoredResponse

pytestmark = pytest.mark.integration


def _record(tenant: str, response_id: str, text: str = "hi") -> StoredResponse:
    return StoredResponse(tenant=tenant, response={"id": response_id, "output": [{"t": text}]})


def test_concurrent_reservations_never_pass_the_count_cap(redis_url):
    async def main() -> None:
        client = async_client(redis_url)
        store = ResponseStore(client, retention_s=60, max_count=5, max_bytes=10**6)
        held = await asyncio.gather(
            *(store.reserve("t", f"resp_{i}", size_bytes=10) for i in range(40))
        )
        assert sum(h is None for h in held) == 5
        assert CapUse(count=5, size_bytes=50) in held
        # Another tenant's room is its own.
        assert await store.reserve("u", "resp_x", size_bytes=10) is None
        await client.aclose()

    asyncio.run(main())


def test_bytes_are_counted_as_stored_and_given_back_on_delete(redis_url):
    async def main() -> None:
        client = async_client(redis_url)
        store = ResponseStore(client, retention_s=60, max_count=100, max_bytes=3000)
        assert await store.reserve("t", "resp_a", size_bytes=100) is None
        assert await store.put(_record("t", "resp_a", "x" * 2000))
        # Counted at its stored size (over 2000 bytes), not the 100 it held.
        refused = await store.reserve("t", "resp_b", size_bytes=1000)
        assert refused is not None and refused.count == 1 and refused.size_bytes > 2000
        assert await store.delete("t", "resp_a")
        assert await store.get("t", "resp_a") is None
        assert await store.reserve("t", "resp_b", size_bytes=1000) is None
        # A replacement keeping its expiry stores nothing once the record is gone.
        assert not await store.put(_record("t", "resp_a"), keep_ttl=True)
        await client.aclose()

    asyncio.run(main())


def test_room_held_for_a_response_never_stored_comes_back(redis_url, monkeypatch):
    monkeypatch.setattr(response_store, "RESERVE_S", 1)

    async def main() -> None:
        client = async_client(redis_url)
        store = ResponseStore(client, retention_s=60, max_count=1, max_bytes=10**6)
        assert await store.reserve("t", "resp_lost", size_bytes=10) is None
        assert await store.reserve("t", "resp_next", size_bytes=10) is not None
        deadline = asyncio.get_running_loop().time() + 10
        while await store.reserve("t", "resp_next", size_bytes=10) is not None:
            assert asyncio.get_running_loop().time() < deadline, "the held room never came back"
            await asyncio.sleep(0.1)
        await client.aclose()

    asyncio.run(main())


def test_headroom_follows_maxmemory_and_is_off_without_one(redis_url):
    """A Redis without maxmemory (an operator's, unbounded) refuses no tenant write; one
    whose use is past the high-water mark does, once the cached reading is renewed."""
    admin = redis.Redis.from_url(redis_url)
    limit = admin.config_get("maxmemory")["maxmemory"]

    async def main() -> None:
        client = async_client(redis_url)
        headroom = RedisHeadroom(client, high_water=0.9, cache_s=0.0)
        admin.config_set("maxmemory", 0)
        assert await headroom.tenant_write_allowed()
        used = (await headroom.reading()).used_memory_bytes
        admin.config_set("maxmemory", used)  # already past 90 % of it
        reading = await headroom.reading()
        assert reading.maxmemory_bytes == used and not reading.tenant_write_allowed
        cached = RedisHeadroom(client, high_water=0.9, cache_s=3600)
        admin.config_set("maxmemory", 0)
        assert await cached.tenant_write_allowed()
        admin.config_set("maxmemory", used)
        assert await cached.tenant_write_allowed(), "read once, then cached"
        await client.aclose()

    try:
        asyncio.run(main())
    finally:
        admin.config_set("maxmemory", limit)
        admin.close()
