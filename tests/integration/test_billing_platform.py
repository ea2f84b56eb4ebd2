"""Billing through the whole platform (`ebb up` on the fake engine): rate limits, keys
hashed at rest, tenants kept apart, prices, GPU time from launch to exit, jobs."""

from __future__ import annotations

import json

import httpx
import pytest
import redis
from support import wait_until
from support.billing import (
    deploy,
    ensure_deployment,
    gpu_segments,
    new_key,
    run_cli,
    tenant_client,
    usage_total,
)

from ebb.queue import keys

pytestmark = pytest.mark.integration


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
