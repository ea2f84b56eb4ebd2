"""Every Lua script, with its prelude, compiles on a real Redis and its clock helper reads
the server's time."""

from __future__ import annotations

from importlib import resources

import pytest
import redis

from ebb.queue.scripts import PRELUDE, lua_source

pytestmark = pytest.mark.integration

LUA = resources.files("ebb.queue").joinpath("lua")
SCRIPTS = sorted(
    p.name[: -len(".lua")]
    for p in LUA.iterdir()
    if p.name.endswith(".lua") and p.name != f"{PRELUDE}.lua"
)


def test_every_script_compiles_with_the_prelude(redis_url):
    client = redis.Redis.from_url(redis_url)
    try:
        for name in SCRIPTS:
            client.script_load(lua_source(name))  # raises ResponseError on a compile error
    finally:
        client.close()


def test_now_ms_is_the_servers_clock_in_milliseconds(redis_url):
    client = redis.Redis.from_url(redis_url)
    try:
        before = _ms(client.time())
        now_ms = int(client.eval(LUA.joinpath(f"{PRELUDE}.lua").read_text() + "return now_ms()", 0))
        assert before <= now_ms <= _ms(client.time())
    finally:
        client.close()


def _ms(server_time: tuple[int, int]) -> int:
    seconds, micros = server_time
    return seconds * 1000 + micros // 1000
