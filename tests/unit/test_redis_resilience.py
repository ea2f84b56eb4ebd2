"""Pieces of surviving Redis failures that need no Redis: the runner's retry budget, the
embedded server's password and configuration, and the 503 every route answers."""

from __future__ import annotations

import os
import stat

import pytest
import redis
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from ebb.config import Settings
from ebb.frontdoor import redis_down
from ebb.queue.connection import retries_for
from ebb.redis_server import PASSWORD_FILE, EmbeddedRedis, free_port, maxmemory_bytes


@pytest.mark.parametrize("outage_s", [0.5, 5, 30])
def test_the_runner_retries_for_about_the_outage_it_is_given(outage_s):
    retries = retries_for(outage_s, 0.05, 1.0)
    waits = [min(1.0, 0.05 * 2**n) for n in range(1, retries + 1)]
    assert sum(waits) >= outage_s > sum(waits[:-1])


def test_the_embedded_redis_password_is_generated_once_owner_only(tmp_path):
    settings = Settings(home=tmp_path)
    first = EmbeddedRedis(settings, port=6390)
    path = tmp_path / PASSWORD_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    password = path.read_text().strip()
    assert EmbeddedRedis(settings, port=6391).url.split("@")[0] == first.url.split("@")[0]
    config = first.config()
    assert f"requirepass {password}\n" in config and "appendfsync always\n" in config
    assert "bind 127.0.0.1\n" in config and "appendonly yes\n" in config
    assert first.url.endswith("@127.0.0.1:6390/0") and password in first.url


def test_the_embedded_redis_is_bounded_and_never_evicts(tmp_path):
    """maxmemory from the setting (a quarter of the host's RAM unset, 0: none), and
    `noeviction`: past the limit writes fail rather than platform state being dropped."""
    config = EmbeddedRedis(Settings(home=tmp_path, redis_maxmemory_bytes="64MiB")).config()
    assert f"maxmemory {64 * 2**20}\n" in config and "maxmemory-policy noeviction\n" in config
    assert (
        "maxmemory 0\n" in EmbeddedRedis(Settings(home=tmp_path, redis_maxmemory_bytes=0)).config()
    )
    ram_bytes = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert maxmemory_bytes(None) == ram_bytes // 4 > 0


def test_the_embedded_redis_never_takes_the_frontdoors_port(tmp_path, monkeypatch):
    """`ebb up` starts Redis before the frontdoor binds its port, so the kernel may offer
    that port as free: a bench once saw Redis take it and the frontdoor fail to bind."""
    offered = iter([8123, 8123, 9001])

    class Socket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(offered)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr("ebb.redis_server.socket.socket", Socket)
    assert EmbeddedRedis(Settings(home=tmp_path, port=8123)).port == 9001
    offered = iter([8123])
    assert free_port() == 8123  # nothing to avoid: the first the kernel offers


def _app(error: Exception) -> TestClient:
    app = FastAPI()

    @app.get("/boom")
    async def boom() -> None:
        raise error

    redis_down.install(
        app,
        3,
        lambda e: JSONResponse(
            e.to_body(),
            status_code=e.status_code,
            headers={"Retry-After": str(int(e.retry_after_s))},
        ),
    )
    return TestClient(app)


@pytest.mark.parametrize(
    "error",
    [
        redis.ConnectionError("refused"),
        redis.TimeoutError("slow"),
        redis.exceptions.BusyLoadingError("loading"),
        redis.exceptions.OutOfMemoryError("OOM"),
    ],
)
def test_redis_unavailable_is_a_503_in_the_openai_shape(error):
    response = _app(error).get("/boom")
    assert response.status_code == 503 and response.headers["Retry-After"] == "3"
    body = response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["code"] == "redis_unavailable" and "Retry" in body["message"]


def test_a_progress_event_published_twice_is_read_once_per_attempt():
    from ebb.queue.requests import RepeatFilter
    from ebb.queue.schema import ChoiceDelta, Claimed, Finished, Progress

    def p(seq: int) -> Progress:
        return Progress(choices=[ChoiceDelta(index=0, text="x", token_count=1)], seq=seq)

    # A retried publish repeats seq 2; a rerun on another runner numbers from 1 again.
    events = [Claimed("r1"), p(1), p(2), p(2), p(3), Claimed("r2"), p(1), p(2), Finished(3, 2)]
    repeats = RepeatFilter()
    kept = [e for e in events if repeats.keep(e)]
    assert [getattr(e, "seq", None) for e in kept] == [None, 1, 2, 3, None, 1, 2, None]
    assert all(RepeatFilter().keep(p(0)) for _ in range(2))  # unnumbered: all kept
