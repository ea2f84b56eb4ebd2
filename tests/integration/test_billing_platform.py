"""Billing through the whole platform (`ebb up` on the fake engine): 1,000 mixed requests
reconcile exactly with what the clients were told; rate limits; keys; tenants."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass

import httpx
import msgspec
import pytest
import redis
from support import REPO_ROOT, Platform, temp_home, wait_until

from ebb.queue import keys
from ebb.queue.metering import decode_gpu_entry
from ebb.queue.schema import UsageRecord

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
PRICES = {
    "price_per_1m_input_tokens_micros": 500_000,
    "price_per_1m_output_tokens_micros": 1_500_000,
    "price_per_gpu_second_micros": 1_000,
}


@pytest.fixture(scope="module")
def platform():
    p = Platform(home=temp_home("ebb-bill-"), redis_url=None, env_extra={"EBB_PREWARM": "0"})
    p.start()
    yield p
    assert p.stop() == 0


@pytest.fixture(scope="module")
def admin(platform):
    with platform.admin() as client:
        yield client


@pytest.fixture(scope="module")
def platform_redis(platform):
    return platform.redis()


def deploy(admin: httpx.Client, name: str, source: str, **fields) -> None:
    response = admin.post("/v1/deployments", json={"name": name, "source": source, **fields})
    assert response.status_code == 201, response.text


def new_key(admin: httpx.Client, tenant: str, **limits) -> str:
    response = admin.post("/v1/keys", json={"tenant": tenant, **limits})
    assert response.status_code == 201, response.text
    return response.json()["key"]


# --- the load: what each client sent and what it was told --------------------------------


@dataclass
class Outcome:
    kind: str  # what the test meant to do
    tenant: str
    status: int = 0
    request_id: str | None = None
    usage: dict | None = None  # the usage the client received
    streamed_tokens: int = 0  # content deltas seen (cancelled / failed streams)
    error: str | None = None
    max_tokens: int = 0


async def _call(client: httpx.AsyncClient, key: str, body: dict, out: Outcome, stop_after=None):
    headers = {"Authorization": f"Bearer {key}"}
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    out.max_tokens = body.get("max_tokens", 0) * body.get("n", 1)
    if not body.get("stream"):
        response = await client.post(path, json=body, headers=headers)
        out.status, out.request_id = response.status_code, response.headers.get("x-request-id")
        if response.status_code == 200:
            out.usage = response.json()["usage"]
        return
    async with client.stream("POST", path, json=body, headers=headers) as response:
        out.status, out.request_id = response.status_code, response.headers.get("x-request-id")
        if response.status_code != 200:
            await response.aread()
            return
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                out.error = chunk["error"]["code"]
            elif chunk.get("usage"):
                out.usage = chunk["usage"]
            elif chunk.get("choices"):
                out.streamed_tokens += 1
                if stop_after is not None and out.streamed_tokens >= stop_after:
                    return  # leaving mid-stream: the connection closes unread


def _mixed_bodies(rng: random.Random) -> list[tuple[str, str, dict]]:
    """(kind, tenant, body) for 940 requests; the 30 killed and 30 rate-limited come apart."""
    plan = []
    for i in range(940):
        tenant = ("acme", "beta")[i % 2]
        n = rng.choice((1, 1, 2))
        if i < 560:
            kind, body = "full", {"max_tokens": rng.randint(1, 24), "n": n}
        elif i < 810:
            kind = "streamed"
            body = {"max_tokens": rng.randint(1, 24), "n": n, "stream": True}
            body["stream_options"] = {"include_usage": True}
        elif i < 860:
            kind, body = "cancelled", {"max_tokens": 3000, "stream": True}
        elif i < 900:
            kind, body = "refused_503", {"model": "cold", "max_tokens": 4}
        else:
            kind, body = "bad_400", {"max_tokens": 0}
        body.setdefault("model", "mix")
        if rng.random() < 0.3 and kind != "cancelled":
            body["prompt"] = "Paris is"
        else:
            body["messages"] = MESSAGES
        plan.append((kind, tenant, body))
    rng.shuffle(plan)
    return plan


VICTIM_BODY = {"model": "victim", "messages": MESSAGES, "max_tokens": 2000, "stream": True}


async def _run_load(platform, admin, platform_redis, keys_by_tenant) -> list[Outcome]:
    outcomes: list[Outcome] = []
    # Idle connections are dropped before the server's keep-alive timeout could close one
    # under a request being sent on it.
    limits = httpx.Limits(max_connections=64, keepalive_expiry=1.0)
    async with httpx.AsyncClient(base_url=platform.base_url, timeout=120, limits=limits) as client:
        gate = asyncio.Semaphore(24)

        async def one(out: Outcome, body: dict, stop_after=None) -> None:
            async with gate:
                await _call(client, keys_by_tenant[out.tenant], body, out, stop_after)

        # 30 long streams on "victim", whose runner is SIGKILLed while they run.
        victims = [Outcome("killed", "acme") for _ in range(30)]
        victim_calls = [_call(client, keys_by_tenant["acme"], VICTIM_BODY, out) for out in victims]
        calls = [*victim_calls, _kill_victim_runner(admin, platform_redis, victims)]
        for kind, tenant, body in _mixed_bodies(random.Random(5)):
            out = Outcome(kind, tenant)
            calls.append(one(out, body, stop_after=3 if kind == "cancelled" else None))
            outcomes.append(out)
        for _ in range(30):
            out = Outcome("limited", "limited")
            calls.append(one(out, {"model": "mix", "messages": MESSAGES, "max_tokens": 5}))
            outcomes.append(out)
        await asyncio.gather(*calls)
    return outcomes + victims


async def _kill_victim_runner(admin: httpx.Client, platform_redis, victims: list[Outcome]):
    """SIGKILL the victims' runner once every one of them is generating and the runner has
    heartbeated since it became ready."""

    def ready_to_kill() -> dict | None:
        if not all(v.streamed_tokens for v in victims):
            return None
        [runner] = admin.get("/v1/deployments/victim").json()["runners"]
        beat, ready = platform_redis.hmget(keys.runner(runner["id"]), "heartbeat_ms", "ready_ms")
        return runner if beat and ready and int(beat) > int(ready) else None

    deadline = asyncio.get_running_loop().time() + 120
    while not (runner := await asyncio.to_thread(ready_to_kill)):
        assert asyncio.get_running_loop().time() < deadline, "the victims never all ran"
        await asyncio.sleep(0.05)
    os.kill(runner["pid"], signal.SIGKILL)


# --- reading the ledger back -----------------------------------------------------------


def raw_usage(platform_redis) -> list[UsageRecord]:
    return [
        msgspec.json.decode(fields[b"r"], type=UsageRecord)
        for _, fields in platform_redis.xrange(keys.USAGE)
    ]


def ledger_caught_up(platform_redis) -> bool:
    """Every raw record written so far is folded into the aggregates."""
    state = platform_redis.hgetall(keys.LEDGER_STATE)
    last = platform_redis.xrevrange(keys.USAGE, count=1)
    return bool(last) and state.get(b"usage_cursor") == last[0][0]


def token_cost(r: UsageRecord) -> int:
    # Computed here independently of ebb.billing: priced per 1M tokens, rounded half up.
    numerator = r.prompt_tokens * 500_000 + r.completion_tokens * 1_500_000
    return (numerator + 500_000) // 1_000_000


def usage_total(client: httpx.Client, **params) -> dict:
    response = client.get("/v1/usage", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def run_cli(platform: Platform, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        EBB_HOME=str(platform.home),
        EBB_PORT=str(platform.port),
        EBB_ADMIN_KEY=platform.admin_key,
    )
    return subprocess.run(
        [sys.executable, "-m", "ebb", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(900)
def test_a_thousand_mixed_requests_reconcile_exactly(platform, admin, platform_redis):
    deploy(admin, "mix", "fake://m?ctx=8192&step_ms=2", max_replicas=2, max_concurrency=64,
           idle_timeout_s=600, owner="acme", **PRICES)  # fmt: skip
    deploy(admin, "victim", "fake://v?ctx=4096&step_ms=20", idle_timeout_s=600, owner="acme",
           **PRICES)  # fmt: skip
    deploy(admin, "cold", "fake://c?fail=1", admission_timeout_s=1, queue_depth_limit=4)
    keys_by_tenant = {t: new_key(admin, t) for t in ("acme", "beta")}
    keys_by_tenant["limited"] = new_key(admin, "limited", requests_per_minute=5)

    outcomes = asyncio.run(_run_load(platform, admin, platform_redis, keys_by_tenant))

    # 1. The clients saw what each kind of request should give.
    assert len(outcomes) == 1000
    by_kind: dict[str, list[Outcome]] = {}
    for out in outcomes:
        by_kind.setdefault(out.kind, []).append(out)
    for out in by_kind["full"] + by_kind["streamed"]:
        assert out.status == 200 and out.usage, out
    assert all(o.status == 200 and o.usage is None and o.streamed_tokens >= 3
               for o in by_kind["cancelled"])  # fmt: skip
    assert all(o.status == 503 for o in by_kind["refused_503"])
    assert all(o.status == 400 for o in by_kind["bad_400"])
    assert all(o.error == "runner_lost" and o.usage is None for o in by_kind["killed"])
    assert {o.status for o in by_kind["limited"]} == {200, 429}
    served = [o for o in outcomes if o.usage]
    cancelled = by_kind["cancelled"]

    # 2. Once the cancelled ones ended in their runner and the ledger caught up ...
    for out in cancelled:
        wait_until(
            lambda o=out: (
                platform_redis.hget(keys.request(o.request_id), "state")
                in (b"cancelled", b"finished")
            ),
            60,
            f"{out.request_id} to end in its runner",
        )
    wait_until(lambda: ledger_caught_up(platform_redis), 60, "the ledger to fold everything")

    # 3. ... every raw record is one request a client was served or abandoned, once each.
    records = raw_usage(platform_redis)
    ids = [r.request_id for r in records]
    assert len(ids) == len(set(ids)), "a request id was billed twice"
    by_id = {r.request_id: r for r in records}
    assert set(by_id) == {o.request_id for o in served + cancelled}
    for out in served:
        r = by_id[out.request_id]
        assert (r.state, r.prompt_tokens, r.completion_tokens) == (
            "finished",
            out.usage["prompt_tokens"],
            out.usage["completion_tokens"],
        )
    for out in cancelled:
        r = by_id[out.request_id]
        assert r.state == "cancelled", "abandoned streams are billed as cancelled"
        assert out.streamed_tokens <= r.completion_tokens < out.max_tokens
    for out in by_kind["killed"] + by_kind["refused_503"]:
        assert out.request_id not in by_id

    # 4. The aggregates equal what the clients were told, per tenant, to the token and micro.
    rows = {row["tenant"]: row for row in usage_total(admin, group_by="tenant")["data"]}
    for tenant in ("acme", "beta", "limited"):
        told = [o.usage for o in served if o.tenant == tenant]
        mine = [by_id[o.request_id] for o in served + cancelled if o.tenant == tenant]
        row = rows[tenant]
        assert row["requests"] == len(mine)
        assert row["prompt_tokens"] == sum(u["prompt_tokens"] for u in told) + sum(
            by_id[o.request_id].prompt_tokens for o in cancelled if o.tenant == tenant
        )
        assert row["completion_tokens"] == sum(u["completion_tokens"] for u in told) + sum(
            by_id[o.request_id].completion_tokens for o in cancelled if o.tenant == tenant
        )
        assert row["token_cost_micros"] == sum(token_cost(r) for r in mine)
    beta_key = httpx.Client(
        base_url=platform.base_url, headers={"Authorization": f"Bearer {keys_by_tenant['beta']}"}
    )
    assert usage_total(beta_key)["total"]["requests"] == rows["beta"]["requests"]
    assert beta_key.get("/v1/usage", params={"tenant": "acme"}).status_code == 404

    # 5. The killed runner's GPU time runs from its launch to its last heartbeat, exactly.
    [victim] = [r for r in admin.get("/v1/deployments/victim").json()["runners"]]
    runner_key = keys.runner(victim["id"])
    wait_until(lambda: platform_redis.hget(runner_key, "meter_closed") == b"1", 60,
               "the controller to close the killed runner's GPU time")  # fmt: skip
    launched, heartbeat = (int(v) for v in platform_redis.hmget(
        runner_key, "launched_ms", "heartbeat_ms"))  # fmt: skip
    pieces = gpu_segments(platform_redis, victim["id"])
    assert pieces[0].start_ms == launched and pieces[-1].end_ms == heartbeat
    assert all(a.end_ms == b.start_ms for a, b in zip(pieces, pieces[1:], strict=False))
    victim_gpu_ms = heartbeat - launched
    wait_until(
        lambda: (
            {r["deployment"]: r for r in usage_total(admin)["data"]}["victim"]["gpu_ms"]
            == victim_gpu_ms
        ),
        60,
        "the killed runner's GPU time in the usage",
    )

    # 6. Reconcile agrees; tampering with one aggregate is caught.
    result = run_cli(platform, "usage", "reconcile")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no drift" in result.stdout
    hour = int(platform_redis.zrange(keys.LEDGER_HOURS, -1, -1)[0])
    platform_redis.hincrby(keys.ledger_aggregates(hour), "beta|mix|completion_tokens", 1)
    tampered = run_cli(platform, "usage", "reconcile")
    platform_redis.hincrby(keys.ledger_aggregates(hour), "beta|mix|completion_tokens", -1)
    assert tampered.returncode == 4
    assert "beta|mix|completion_tokens" in tampered.stderr


# --- rate limits, keys, tenants, prices --------------------------------------------------


def ensure_deployment(admin: httpx.Client, name: str, source: str, **fields) -> None:
    if admin.get(f"/v1/deployments/{name}").status_code == 404:
        deploy(admin, name, source, **fields)


def tenant_client(platform: Platform, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=platform.base_url, timeout=60, headers={"Authorization": f"Bearer {key}"}
    )


def complete(client: httpx.Client, max_tokens: int, **extra) -> httpx.Response:
    body = {"model": "rl", "prompt": "Hi", "max_tokens": max_tokens, **extra}
    return client.post("/v1/completions", json=body)


def test_requests_per_minute_answer_429_with_retry_after(platform, admin):
    ensure_deployment(admin, "rl", "fake://m?ctx=1024", idle_timeout_s=600)
    ensure_deployment(admin, "cold", "fake://c?fail=1", admission_timeout_s=1)
    client = tenant_client(platform, new_key(admin, "rpm-t", requests_per_minute=2))
    # A 503 did no work: it gives its request back.
    refused = client.post("/v1/completions", json={"model": "cold", "prompt": "Hi"})
    assert refused.status_code == 503
    assert [complete(client, 2).status_code for _ in range(2)] == [200, 200]
    limited = complete(client, 2)
    assert limited.status_code == 429
    assert 1 <= int(limited.headers["retry-after"]) <= 30  # a request refills in 60 s / 2
    error = limited.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert "2 requests per minute" in error["message"]


def test_a_tenants_limit_is_shared_by_its_keys(platform, admin):
    ensure_deployment(admin, "rl", "fake://m?ctx=1024", idle_timeout_s=600)
    first, second = (tenant_client(platform, new_key(admin, "shared-t")) for _ in range(2))
    put = admin.put("/v1/tenants/shared-t/limits", json={"requests_per_minute": 2})
    assert put.status_code == 200 and put.json()["requests_per_minute"] == 2
    assert complete(first, 1).status_code == 200
    assert complete(second, 1).status_code == 200
    limited = complete(first, 1)
    assert limited.status_code == 429 and "tenant 'shared-t'" in limited.json()["error"]["message"]
    tenants = {t["tenant"]: t for t in admin.get("/v1/tenants").json()["data"]}
    assert tenants["shared-t"]["active_keys"] == 2
    assert tenants["shared-t"]["limits"]["requests_per_minute"] == 2


def test_tokens_per_minute_reserve_max_tokens_and_settle_on_completion(platform, admin):
    ensure_deployment(admin, "rl", "fake://m?ctx=1024", idle_timeout_s=600)
    prompt = complete(admin, 1).json()["usage"]["prompt_tokens"]
    client = tenant_client(platform, new_key(admin, "tpm-t", tokens_per_minute=prompt + 100))
    too_large = complete(client, 101)
    assert too_large.status_code == 400 and too_large.json()["error"]["param"] == "max_tokens"
    assert "tokens per minute" in too_large.json()["error"]["message"]
    # Reserves the whole bucket (prompt + 100), but stops early on "capital": the unused
    # tokens come back at completion, so the next request fits.
    early = complete(client, 100, stop=["capital"])
    assert early.status_code == 200
    used = early.json()["usage"]["total_tokens"]
    assert used < prompt + 50
    assert complete(client, 40).status_code == 200
    limited = complete(client, 100)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert "tokens per minute" in limited.json()["error"]["message"]


def test_keys_are_hashed_at_rest_shown_once_and_found_by_prefix(platform, admin, platform_redis):
    created = admin.post("/v1/keys", json={"tenant": "keys-t", "name": "ci"}).json()
    secret = created["key"]
    assert secret.startswith(created["prefix"]) and len(created["prefix"]) < len(secret) - 32
    hidden = secret[len(created["prefix"]) :]
    for key in platform_redis.scan_iter(count=1000):
        for value in _values(platform_redis, key):
            assert hidden.encode() not in value, f"the key is readable in {key!r}"
    listed = admin.get("/v1/keys").json()["data"]
    assert all("key" not in k for k in listed), "a listing never shows a secret"
    for prefix in (created["prefix"], secret[:12], created["id"][:8], secret):
        found = admin.get("/v1/keys", params={"prefix": prefix}).json()["data"]
        assert [k["id"] for k in found] == [created["id"]], prefix
    by_tenant = admin.get("/v1/keys", params={"tenant": "keys-t"}).json()["data"]
    assert [k["id"] for k in by_tenant] == [created["id"]]
    listed_by_cli = run_cli(platform, "keys", "list", "--prefix", created["prefix"], "--json")
    assert [k["id"] for k in json.loads(listed_by_cli.stdout)["data"]] == [created["id"]]
    assert admin.delete(f"/v1/keys/{created['id']}").status_code == 200
    assert tenant_client(platform, secret).get("/v1/models").status_code == 401


def _values(client: redis.Redis, key: bytes) -> list[bytes]:
    kind = client.type(key)
    if kind == b"string":
        return [client.get(key)]
    if kind == b"hash":
        return [b"%s=%s" % kv for kv in client.hgetall(key).items()]
    if kind == b"list":
        return client.lrange(key, 0, -1)
    if kind in (b"set", b"zset"):
        return list(client.smembers(key)) if kind == b"set" else client.zrange(key, 0, -1)
    if kind == b"stream":
        return [repr(fields).encode() for _, fields in client.xrange(key)]
    return []


def test_a_tenant_sees_only_its_own_usage(platform, admin, platform_redis):
    ensure_deployment(admin, "rl", "fake://m?ctx=1024", idle_timeout_s=600)
    a = tenant_client(platform, new_key(admin, "iso-a"))
    b = tenant_client(platform, new_key(admin, "iso-b"))
    assert complete(a, 3).status_code == 200
    assert complete(b, 4).status_code == 200
    assert complete(b, 5).status_code == 200
    # No waiting for the ledger consumer: a report includes what it has not folded yet.
    mine = usage_total(a)
    assert mine["tenant"] == "iso-a"
    assert (mine["total"]["requests"], mine["total"]["completion_tokens"]) == (1, 3)
    assert a.get("/v1/usage", params={"tenant": "iso-b"}).status_code == 404
    assert a.get("/v1/usage", params={"tenant": "nobody"}).status_code == 404
    theirs = usage_total(admin, tenant="iso-b")
    assert (theirs["total"]["requests"], theirs["total"]["completion_tokens"]) == (2, 9)
    by_day = usage_total(b, group_by="day,deployment")
    assert [row["deployment"] for row in by_day["data"]] == ["rl"]
    assert a.get("/v1/usage", params={"group_by": "week"}).status_code == 400
    assert a.get("/v1/usage", params={"start": "yesterday"}).status_code == 400
    assert a.get("/v1/usage/reconcile").status_code == 403


def test_prices_are_set_exactly_and_validated(platform, admin):
    ensure_deployment(admin, "priced", "fake://m", idle_timeout_s=600)
    result = run_cli(platform, "price", "priced", "--input", "0.15", "--output", "0.6",
                     "--gpu-second", "0.000278", "--owner", "acme")  # fmt: skip
    assert result.returncode == 0, result.stderr
    spec = admin.get("/v1/deployments/priced").json()
    assert spec["price_per_1m_input_tokens_micros"] == 150_000
    assert spec["price_per_1m_output_tokens_micros"] == 600_000
    assert spec["price_per_gpu_second_micros"] == 278
    assert spec["owner"] == "acme"
    too_precise = run_cli(platform, "price", "priced", "--input", "0.0000001")
    assert too_precise.returncode == 2 and "6 decimals" in too_precise.stderr
    negative = admin.patch("/v1/deployments/priced", json={"price_per_gpu_second_micros": -1})
    assert negative.status_code == 400
    assert negative.json()["error"]["param"] == "price_per_gpu_second_micros"
    bad_owner = admin.patch("/v1/deployments/priced", json={"owner": "a b"})
    assert bad_owner.status_code == 400 and bad_owner.json()["error"]["param"] == "owner"


def gpu_segments(platform_redis, runner_id: str) -> list:
    return [
        decode_gpu_entry(fields)
        for _, fields in platform_redis.xrange(keys.GPU_USAGE)
        if b"g" in fields and json.loads(fields[b"g"])["runner_id"] == runner_id
    ]


def test_a_runner_is_billed_from_launch_to_exit_to_its_owner(platform, admin, platform_redis):
    deploy(
        admin, "brief", "fake://b", idle_timeout_s=1, owner="gpu-t", price_per_gpu_second_micros=500
    )
    client = tenant_client(platform, new_key(admin, "gpu-t"))
    reply = client.post("/v1/completions", json={"model": "brief", "prompt": "Hi"})
    assert reply.status_code == 200
    [runner] = wait_until(
        lambda: (
            (rs := admin.get("/v1/deployments/brief").json()["runners"])
            and rs[0]["state"] == "exited"
            and rs
        ),
        60,
        "the runner to drain and exit",
    )
    runner_key = keys.runner(runner["id"])
    wait_until(lambda: platform_redis.hget(runner_key, "meter_closed") == b"1", 30, "its close")
    times = platform_redis.hmget(runner_key, "launched_ms", "exited_ms")
    launched, exited = (int(v) for v in times)
    pieces = gpu_segments(platform_redis, runner["id"])
    assert pieces[0].start_ms == launched and pieces[-1].end_ms == exited
    assert all(a.end_ms == b.start_ms for a, b in zip(pieces, pieces[1:], strict=False))
    assert {(p.meter.deployment, p.meter.tenant) for p in pieces} == {("brief", "gpu-t")}
    gpu_ms = exited - launched
    usage = wait_until(
        lambda: (u := usage_total(client))["total"]["gpu_ms"] == gpu_ms and u,
        30,
        "the runner's GPU time in its owner's usage",
    )
    assert usage["total"]["gpu_cost_micros"] == (gpu_ms * 500 + 500) // 1000
    [economics] = usage["unit_economics"]
    assert economics["deployment"] == "brief"
    assert economics["gpu_seconds_per_1m_output_tokens"] == round(
        gpu_ms / 1000 / usage["total"]["completion_tokens"] * 1_000_000, 3
    )
    shown = run_cli(platform, "usage", "--tenant", "gpu-t", "--group-by", "tenant,deployment")
    assert shown.returncode == 0, shown.stderr
    assert "gpu-t" in shown.stdout and "brief" in shown.stdout


def test_a_job_is_billed_once_to_its_tenant_and_hidden_from_others(platform, admin):
    ensure_deployment(admin, "rl", "fake://m?ctx=1024", idle_timeout_s=600)
    a = tenant_client(platform, new_key(admin, "job-a"))
    b = tenant_client(platform, new_key(admin, "job-b"))
    submitted = a.post(
        "/v1/jobs",
        json={
            "model": "rl",
            "endpoint": "completions",
            "body": {"prompt": "Hi", "max_tokens": 6},
        },
    )
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    job = wait_until(
        lambda: (j := a.get(f"/v1/jobs/{job_id}").json())["status"] == "succeeded" and j,
        60,
        "the job to succeed",
    )
    assert b.get(f"/v1/jobs/{job_id}").status_code == 404, "another tenant's job is not there"
    total = usage_total(a)["total"]
    assert total["requests"] == 1
    assert total["prompt_tokens"] == job["usage"]["prompt_tokens"]
    assert total["completion_tokens"] == job["usage"]["completion_tokens"] == 6
    assert usage_total(b)["total"]["requests"] == 0
