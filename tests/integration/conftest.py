from __future__ import annotations

import pytest
import redis
from support import Platform, RedisServer, free_port, temp_home

from ebb.queue.connection import async_client
from ebb.queue.requests import RequestQueue


@pytest.fixture(scope="session")
def redis_server():
    server = RedisServer(port=free_port(), data_dir=temp_home("ebb-redis-")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield redis_server.url
    client.close()


@pytest.fixture
async def queue(redis_url):
    """The frontdoor's side of the request queue, on a flushed Redis (claim-path tests)."""
    client = async_client(redis_url)
    yield RequestQueue(client, request_ttl_s=60)
    await client.aclose()


# A whole platform (`ebb up`, fake engine, no pre-warmed pool) per test module, for modules
# that need nothing special; a module defining its own `platform` fixture overrides it.


@pytest.fixture(scope="module")
def platform():
    p = Platform(home=temp_home("ebb-it-"), redis_url=None).start()
    yield p
    assert p.stop() == 0
