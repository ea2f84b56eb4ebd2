"""Redis failures through the whole platform (`ebb up`, fake engine): the embedded Redis
has a password and comes back by itself after SIGKILL, in-flight work rides the restart
out, and while Redis stays down every route answers 503 with Retry-After, never 500."""

from __future__ import annotations

import json
import os
import signal
import stat
import threading

import httpx
import psutil
import pytest
import redis
from support import Platform, RedisServer, deploy, free_port, temp_home, wait_until
from support.platform_processes import pid_of

from ebb.queue import keys
from ebb.testing.fake_model import FAKE_REPLY

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def redis_server_of(platform: Platform) -> psutil.Process:
    def find():
        children = psutil.Process(platform.proc.pid).children()
        live = [c for c in children if c.name() == "redis-server" and c.status() != "zombie"]
        return live[0] if live else None

    return wait_until(find, 30, "the embedded redis-server")


def kill_embedded_redis(platform: Platform) -> int:
    """SIGKILL the platform's redis-server and wait until `ebb up` started a new one."""
    old = redis_server_of(platform).pid
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: redis_server_of(platform).pid != old, 30, "redis-server restarted")
    return old


def stream_lines(client: httpx.Client, body: dict, on_first=None) -> list[str]:
    """Every `data:` line of a streamed answer; `on_first()` runs after the first one."""
    lines = []
    with client.stream("POST", "/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            lines.append(line)
            if len(lines) == 1 and on_first is not None:
                on_first()
    return lines


def streamed_text(lines: list[str]) -> str:
    chunks = [json.loads(line[6:]) for line in lines if line != "data: [DONE]"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


# --- the embedded Redis: password, supervision ----------------------------------------


@pytest.fixture(scope="module")
def platform():
    p = Platform(home=temp_home("ebb-redis-fail-"), redis_url=None).start()
    yield p
    assert p.stop() == 0


def test_embedded_redis_requires_its_generated_password(platform):
    password_file = platform.home / "redis_password"
    password = password_file.read_text().strip()
    assert len(password) >= 32
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    assert stat.S_IMODE((platform.home / "run.json").stat().st_mode) == 0o600
    server = redis_server_of(platform)
    port = next(c.laddr.port for c in server.net_connections() if c.status == "LISTEN")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=port).ping()
    assert platform.redis().ping()
    # Neither a command line (`ps`) nor the operator's log shows it.
    assert not any(password in part for part in server.cmdline())
    assert password not in platform.log_path.read_text()
    assert all(password not in command_line(c) for c in psutil.Process().children(True))


def command_line(process: psutil.Process) -> str:
    """Its command line; '' for one that has exited since it was listed, or not yet been
    reaped (a zombie has none: an earlier module's platform that outlived its stop)."""
    try:
        return " ".join(process.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return ""


def test_killed_redis_comes_back_with_its_data(platform, admin):
    deploy(admin, "survivor")
    before = platform.openai().chat.completions.create(
        model="survivor", messages=MESSAGES, max_tokens=4
    )
    frontdoor = pid_of(platform.home, "frontdoor")
    kill_embedded_redis(platform)
    # The deployment (and the key of every process) outlived the crash: the same
    # frontdoor answers without anyone restarting anything.
    after = wait_until(
        lambda: _try_chat(platform, "survivor"), 60, "a completion after the restart"
    )
    assert after.usage.completion_tokens == before.usage.completion_tokens == 4
    assert "restarted" in platform.log_path.read_text()
    assert pid_of(platform.home, "frontdoor") == frontdoor


def _try_chat(platform: Platform, model: str):
    import openai

    try:
        return platform.openai().chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=4
        )
    except openai.APIStatusError as e:
        assert e.status_code == 503, e  # never a 500 while Redis comes back
        return None


def test_a_stream_rides_out_a_redis_restart(platform, admin):
    deploy(admin, "steady", source="fake://m?step_ms=20")
    body = {"model": "steady", "messages": MESSAGES, "max_tokens": 120, "stream": True}
    platform.openai().chat.completions.create(model="steady", messages=MESSAGES, max_tokens=1)
    [runner] = [r for r in admin.get("/v1/deployments/steady").json()["runners"]]
    lines = stream_lines(admin, body, on_first=lambda: kill_embedded_redis(platform))
    assert lines[-1] == "data: [DONE]"
    assert not [line for line in lines if '"error"' in line]
    # The runner rode it out too: the same process finished the whole answer.
    assert streamed_text(lines) == (FAKE_REPLY * 8)[:120]
    [after] = [r for r in admin.get("/v1/deployments/steady").json()["runners"]]
    assert after["pid"] == runner["pid"]


def test_lost_runner_before_output_runs_again_and_bills_once(platform, admin):
    # 2 s of "prefill": the runner is killed while the client has seen nothing.
    deploy(admin, "rerun", source="fake://m?prefill_ms=2000")
    client = platform.redis()
    for stream in (False, True):
        before = client.xlen(keys.USAGE)
        result: dict = {}
        body = {"model": "rerun", "messages": MESSAGES, "max_tokens": 8, "stream": stream}

        def call(body=body, result=result):
            with platform.admin() as c:
                if body["stream"]:
                    result["lines"] = stream_lines(c, body)
                else:
                    response = c.post("/v1/chat/completions", json=body)
                    result["status"], result["body"] = response.status_code, response.json()

        thread = threading.Thread(target=call)
        thread.start()
        runner = wait_until(
            lambda: [
                r
                for r in admin.get("/v1/deployments/rerun").json()["runners"]
                if r["state"] == "ready"
            ],
            60,
            "a ready runner holding the request",
        )[0]
        wait_until(lambda: client.zcard(keys.LEASES) == 1, 30, "the request claimed")
        os.kill(runner["pid"], signal.SIGKILL)
        thread.join(timeout=120)
        if stream:
            assert result["lines"][-1] == "data: [DONE]"
            assert not [line for line in result["lines"] if '"error"' in line]
            assert streamed_text(result["lines"]) == FAKE_REPLY[:8]
        else:
            assert result["status"] == 200, result
            assert result["body"]["usage"]["completion_tokens"] == 8
        wait_until(lambda n=before: client.xlen(keys.USAGE) > n, 10, "the usage record")
        records = [json.loads(f[b"r"]) for _, f in client.xrange(keys.USAGE)][before:]
        assert [r["completion_tokens"] for r in records] == [8]  # billed once


# --- an external Redis that stays down ---------------------------------------------------


@pytest.fixture(scope="module")
def outside_redis():
    server = RedisServer(port=free_port(), data_dir=temp_home("ebb-redis-down-")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def outside(outside_redis):
    env = {"EBB_REDIS_OUTAGE_S": "2"}
    p = Platform(home=temp_home("ebb-redis-down-"), redis_url=outside_redis.url, env_extra=env)
    yield p.start()
    assert p.stop() == 0


ROUTES = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/chat/completions", {"model": "down", "messages": MESSAGES, "max_tokens": 2}),
    ("POST", "/v1/completions", {"model": "down", "prompt": "hi", "max_tokens": 2}),
    (
        "POST",
        "/v1/jobs",
        {"model": "down", "endpoint": "chat.completions", "body": {"messages": MESSAGES}},
    ),
    ("GET", "/v1/jobs/job_nope", None),
    ("GET", "/v1/deployments", None),
    ("POST", "/v1/deployments", {"name": "other", "source": "fake://m"}),
    ("GET", "/v1/usage", None),
    ("GET", "/v1/status", None),
    ("GET", "/v1/keys", None),
]


def test_redis_down_is_a_503_with_retry_after_on_every_route(outside, outside_redis):
    with outside.admin() as admin:
        deploy(admin, "down")
        outside.openai().chat.completions.create(model="down", messages=MESSAGES, max_tokens=1)
        tenant_key = admin.post("/v1/keys", json={"tenant": "acme"}).json()["key"]
        [runner] = admin.get("/v1/deployments/down").json()["runners"]
        outside_redis.stop()
        try:
            for method, path, body in ROUTES:
                response = admin.request(method, path, json=body)
                assert response.status_code == 503, (path, response.text)
                assert int(response.headers["Retry-After"]) >= 1
                error = response.json()["error"]
                assert error["code"] == "redis_unavailable", (path, error)
                assert set(error) == {"message", "type", "param", "code"}
            tenant = admin.get("/v1/models", headers={"Authorization": f"Bearer {tenant_key}"})
            assert tenant.status_code == 503
            ready = admin.get("/readyz")
            assert ready.status_code == 503 and ready.json()["status"] == "unavailable"
            assert admin.get("/healthz").status_code == 200  # alive, just not ready
            # Past EBB_REDIS_OUTAGE_S (2 s here) the runner gives up and exits.
            wait_until(lambda: _exited(runner["pid"]), 60, "the runner to exit")
        finally:
            outside_redis.start()
        wait_until(lambda: admin.get("/readyz").status_code == 200, 30, "ready again")
        reply = outside.openai().chat.completions.create(
            model="down", messages=MESSAGES, max_tokens=2
        )
        assert reply.usage.completion_tokens == 2


def _exited(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_stream_whose_redis_stays_down_ends_with_an_error_event(outside, outside_redis):
    with outside.admin() as admin:
        deploy(admin, "cut", source="fake://m?step_ms=50")
        body = {"model": "cut", "messages": MESSAGES, "max_tokens": 200, "stream": True}
        try:
            lines = stream_lines(admin, body, on_first=outside_redis.stop)
        finally:
            outside_redis.start()
        errors = [json.loads(line[6:])["error"] for line in lines if '"error"' in line]
        assert [e["code"] for e in errors] == ["redis_unavailable"]
        assert lines[-1] == "data: [DONE]"
        # The same connection answers the next request (the stream closed cleanly).
        wait_until(lambda: admin.get("/readyz").status_code == 200, 30, "ready again")
        assert admin.get("/v1/models").status_code == 200
