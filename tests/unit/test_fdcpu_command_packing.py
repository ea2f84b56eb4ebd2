"""The asyncio clients' command packing: hiredis in one call, the same bytes and errors
as redis-py's own packing."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from redis.exceptions import DataError

from ebb.queue.command_packing import with_fast_packing
from ebb.queue.connection import async_client, short_command_client

COMMANDS = [
    ("EVALSHA", "a" * 40, 2, "ebb:q:x", b"ebb:r:\xff", 1, -3, 2**70, 0.1, 1 / 3, 1e20, "é"),
    ("HGETALL", "ebb:deployment:x"),
    ("XREAD", "BLOCK", 5000, "STREAMS", "a", "b", "0-0", "1-1"),
    ("CLIENT UNBLOCK", 12, "ERROR"),  # several words: redis-py splits the name
    ("SET", "k", bytearray(b"v")),  # hiredis refuses bytearray: redis-py packs it
    ("SET", "k", memoryview(b"v")),
]


def _pair() -> tuple[aioredis.Connection, aioredis.Connection]:
    plain = aioredis.ConnectionPool.from_url("redis://127.0.0.1:1/0")
    fast = with_fast_packing(aioredis.ConnectionPool.from_url("redis://127.0.0.1:1/0"))
    return plain.make_connection(), fast.make_connection()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: str(c[0]))
def test_fast_packing_sends_the_bytes_redis_py_would(command):
    plain, fast = _pair()
    assert type(fast) is not type(plain)
    assert b"".join(fast.pack_commands([command])) == b"".join(plain.pack_commands([command]))


@pytest.mark.parametrize("value", [True, None, object(), "\ud800"])
def test_fast_packing_refuses_what_redis_py_refuses(value):
    plain, fast = _pair()
    with pytest.raises(Exception) as expected:
        plain.pack_command("SET", "k", value)
    with pytest.raises(type(expected.value)):
        fast.pack_command("SET", "k", value)
    if isinstance(value, bool):
        assert expected.type is DataError


async def test_both_asyncio_clients_pack_fast():
    for client in (async_client("redis://127.0.0.1:1/0"), short_command_client("unix:///x")):
        try:
            connection = client.connection_pool.make_connection()
            assert type(connection).__name__.startswith("FastPacking")
        finally:
            await client.aclose()


class _Float(float):
    def __repr__(self) -> str:
        return "Float(2.5)"


def test_subclasses_are_packed_as_redis_py_packs_them():
    plain, fast = _pair()
    command = ("SET", "k", _Float(2.5))
    assert b"".join(fast.pack_commands([command])) == b"".join(plain.pack_commands([command]))
