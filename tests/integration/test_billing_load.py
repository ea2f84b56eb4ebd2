"""Billing through the whole platform (`ebb up` on the fake engine): 1,000 mixed requests
(streamed, non-streamed, abandoned mid-stream, refused with 400, 429 and 503, and thirty
lost with a runner SIGKILLed mid-run) reconcile exactly with what the clients were told."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
from dataclasses import dataclass

import httpx
import pytest
from support import wait_until
from support.billing import (
    MESSAGES,
    PRICES,
    deploy,
    gpu_segments,
    ledger_caught_up,
    new_key,
    raw_usage,
    run_cli,
    usage_total,
)

from ebb.queue import keys
from ebb.queue.schema import UsageRecord

pytestmark = pytest.mark.integration


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


# Two choices: no continuation can replay them (a single one would go on on another
# runner, see test_continuation.py), so the loss is their answer.
VICTIM_BODY = {
    "model": "victim",
    "messages": MESSAGES,
    "max_tokens": 2000,
    "stream": True,
    "n": 2,
}


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


def token_cost(r: UsageRecord) -> int:
    # Computed here independently of ebb.billing: priced per 1M tokens, rounded half up.
    numerator = r.prompt_tokens * 500_000 + r.completion_tokens * 1_500_000
    return (numerator + 500_000) // 1_000_000


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
