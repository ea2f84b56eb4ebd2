"""A slice of the Azure code-completion trace (bench/traces) replayed against the whole
platform on the fake engine: bursts, lulls long enough to scale the deployment to zero,
and cold starts back up. Nothing the platform accepts is lost or billed twice.

Trace seconds 300-430 hold three lulls of 24-39 s between bursts of up to ~50 requests
in 30 s; played 4x faster, the lulls outlast the 2 s idle timeout.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from support import wait_until

from ebb.coldstart.simulation import TraceRequest, load_azure_trace
from ebb.queue import keys

pytestmark = pytest.mark.integration

TRACE = Path(__file__).resolve().parents[2] / "bench" / "traces" / "azllm2023_code.csv"
SPEEDUP = 4.0
MAX_TOKENS = 24


@dataclass
class Outcome:
    status: int
    request_id: str
    completion_tokens: int
    requested_tokens: int


async def replay(base_url: str, key: str, trace: list[TraceRequest]) -> list[Outcome]:
    """Send each request at its (sped-up) arrival time, concurrently, as the trace did."""
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(headers=headers, timeout=120, limits=limits) as client:
        started = time.monotonic()

        async def one(request: TraceRequest) -> Outcome:
            await asyncio.sleep(
                max(0.0, request.arrival_s / SPEEDUP - (time.monotonic() - started))
            )
            tokens = max(1, min(request.output_tokens, MAX_TOKENS))
            body = {
                "model": "replay",
                "messages": [{"role": "user", "content": f"Complete {request.prompt_tokens}"}],
                "max_tokens": tokens,
            }
            response = await client.post(base_url + "/v1/chat/completions", json=body)
            usage = response.json().get("usage") or {} if response.status_code == 200 else {}
            return Outcome(
                response.status_code,
                response.headers.get("x-request-id", ""),
                usage.get("completion_tokens", 0),
                tokens,
            )

        return await asyncio.gather(*(one(r) for r in trace))


def test_replayed_bursts_and_lulls_lose_nothing(platform, admin, platform_redis):
    created = admin.post(
        "/v1/deployments",
        json={
            "name": "replay",
            "source": "fake://m?step_ms=5",
            "max_replicas": 3,
            "max_concurrency": 4,
            "idle_timeout_s": 2,
        },
    )
    assert created.status_code == 201, created.text
    trace = load_azure_trace(TRACE, start_s=300, duration_s=130)
    assert len(trace) > 100

    outcomes = asyncio.run(replay(platform.base_url, platform.admin_key, trace))

    # Every request answered within its admission window: from zero, a start takes ~1 s.
    assert [o.status for o in outcomes] == [200] * len(trace)
    assert all(o.completion_tokens == o.requested_tokens for o in outcomes)
    # Billed exactly once each, in the usage ledger.
    billed = [msg[b"r"] for _, msg in platform_redis.xrange(keys.USAGE)]
    for outcome in outcomes:
        assert sum(outcome.request_id.encode() in record for record in billed) == 1, outcome
    # The lulls scaled the deployment to zero and the next burst brought it back: a runner
    # per burst at least, each drained by its idle timeout, none failed.
    view = wait_until(lambda: all_drained(admin), 30, "the last runner to drain")
    assert len(view["runners"]) >= 4, view["runners"]
    assert view["queue_depth"] == 0


def all_drained(admin: httpx.Client) -> dict | None:
    view = admin.get("/v1/deployments/replay").json()
    return view if all(r["state"] == "exited" for r in view["runners"]) else None
