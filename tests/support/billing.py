"""Helpers for the billing tests that drive a whole platform (`ebb up`)."""

from __future__ import annotations

import json
import subprocess

import httpx
import msgspec

from ebb.queue import keys
from ebb.queue.metering import GpuSegment, decode_gpu_entry
from ebb.queue.schema import UsageRecord
from support import Platform

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
PRICES = {
    "price_per_1m_input_tokens_micros": 500_000,
    "price_per_1m_output_tokens_micros": 1_500_000,
    "price_per_gpu_second_micros": 1_000,
}


def deploy(admin: httpx.Client, name: str, source: str, **fields) -> None:
    response = admin.post("/v1/deployments", json={"name": name, "source": source, **fields})
    assert response.status_code == 201, response.text


def new_key(admin: httpx.Client, tenant: str, **limits) -> str:
    response = admin.post("/v1/keys", json={"tenant": tenant, **limits})
    assert response.status_code == 201, response.text
    return response.json()["key"]


def ensure_deployment(admin: httpx.Client, name: str, source: str, **fields) -> None:
    if admin.get(f"/v1/deployments/{name}").status_code == 404:
        deploy(admin, name, source, **fields)


def tenant_client(platform: Platform, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=platform.base_url, timeout=60, headers={"Authorization": f"Bearer {key}"}
    )


def usage_total(client: httpx.Client, **params) -> dict:
    response = client.get("/v1/usage", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def run_cli(platform: Platform, *args: str) -> subprocess.CompletedProcess:
    return platform.cli(*args)


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


def gpu_segments(platform_redis, runner_id: str) -> list[GpuSegment]:
    return [
        decode_gpu_entry(fields)
        for _, fields in platform_redis.xrange(keys.GPU_USAGE)
        if b"g" in fields and json.loads(fields[b"g"])["runner_id"] == runner_id
    ]
