from __future__ import annotations

import pytest
import redis
from support import Platform, RedisServer, free_port, temp_home


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


# A whole platform (`ebb up`, fake engine, no pre-warmed pool) per test module, for modules
# that need nothing special; a module defining its own `platform` fixture overrides it.


@pytest.fixture(scope="module")
def platform():
    p = Platform(home=temp_home("ebb-it-"), redis_url=None).start()
    yield p
    assert p.stop() == 0


@pytest.fixture(scope="module")
def admin(platform):
    with platform.admin() as client:
        yield client


@pytest.fixture(scope="module")
def platform_redis(platform):
    return platform.redis()
