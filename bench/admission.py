"""Admission at speed: what one frontdoor admits and refuses, through the fake engine.

    .venv/bin/python -m bench.admission [--clients 16 64 --requests 2000 --burst 200]

Admitted: closed-loop clients send non-streamed chat requests (one output token) to a
deployment with one ready fake runner (step 0 ms, 256 slots); requests/s end to end and
the latency each request saw (p50, p99). Refused: a burst of clients at once at a
deployment whose queue is full (its runner is still loading), each answered 503 at once
without waiting for the admission window; p50/p99 of those answers. The platform runs
the test engines (EBB_TEST_ENGINES=1), on this machine's cores beside the load generator,
so the numbers are for that whole machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time

import httpx

from bench.loadgen import save_results
from bench.serving import REPO

sys.path.insert(0, str(REPO / "tests"))

from support import Platform, deploy, deployment, temp_home, wait_until  # noqa: E402

MESSAGES = [{"role": "user", "content": "hi"}]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def admitted(platform: Platform, clients: int, requests: int) -> dict:
    body = {"model": "fast", "messages": MESSAGES, "max_tokens": 1}
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    pending = iter(range(requests))
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(
        base_url=platform.base_url, headers=_auth(platform), timeout=60, limits=limits
    ) as client:

        async def worker() -> None:
            for _ in pending:
                sent = time.perf_counter()
                response = await client.post("/v1/chat/completions", json=body)
                latencies.append(time.perf_counter() - sent)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall_s = time.perf_counter() - started
    return {
        "clients": clients,
        "requests": requests,
        "statuses": statuses,
        "requests_per_s": round(requests / wall_s, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
    }


async def refused(platform: Platform, burst: int) -> dict:
    body = {"model": "full", "messages": MESSAGES, "max_tokens": 1}
    async with httpx.AsyncClient(
        base_url=platform.base_url,
        headers=_auth(platform),
        timeout=60,
        limits=httpx.Limits(max_connections=burst + 4),
    ) as client:

        async def one() -> tuple[int, float]:
            sent = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=body)
            return response.status_code, time.perf_counter() - sent

        results = await asyncio.gather(*(one() for _ in range(burst)))
    refusals = [s for code, s in results if code == 503]
    return {
        "burst": burst,
        "refused": len(refusals),
        "other": len(results) - len(refusals),
        "p50_ms": round(statistics.median(refusals) * 1000, 1) if refusals else None,
        "p99_ms": round(percentile(refusals, 0.99) * 1000, 1) if refusals else None,
    }


def _auth(platform: Platform) -> dict[str, str]:
    return {"Authorization": f"Bearer {platform.admin_key}"}


def fill_queue(platform: Platform, depth: int) -> None:
    """Queue `depth` requests at `full` (its runner is still loading) and leave them waiting."""
    body = {"model": "full", "messages": MESSAGES, "max_tokens": 1}

    async def park() -> None:
        async with httpx.AsyncClient(
            base_url=platform.base_url, headers=_auth(platform), timeout=600
        ) as client:
            await asyncio.gather(
                *(client.post("/v1/chat/completions", json=body) for _ in range(depth))
            )

    # The parked requests wait on a loop of their own, in the background.
    threading.Thread(target=lambda: asyncio.run(park()), daemon=True).start()
    with platform.admin() as admin:
        wait_until(
            lambda: deployment(admin, "full")["queue_depth"] >= depth, 30, "the queue to fill"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--burst", type=int, default=200)
    args = parser.parse_args()

    platform = Platform(
        home=temp_home("ebb-bench-admission-"),
        redis_url=None,
        env_extra={"EBB_TEST_ENGINES": "1"},
    ).start()
    results: dict = {"admitted": [], "refused": None}
    try:
        with platform.admin() as admin:
            deploy(admin, "fast", source="fake://m?step_ms=0", min_replicas=1, max_concurrency=256)
            deploy(
                admin,
                "full",
                source="fake://m?load_s=20",
                queue_depth_limit=8,
                admission_timeout_s=600,
            )
            wait_until(lambda: deployment(admin, "fast")["replicas"]["ready"] == 1, 60, "runner")
        asyncio.run(admitted(platform, 4, 100))  # warm connections and the runner
        for clients in args.clients:
            results["admitted"].append(asyncio.run(admitted(platform, clients, args.requests)))
        fill_queue(platform, 8)
        results["refused"] = asyncio.run(refused(platform, args.burst))
    finally:
        platform.stop()
    for row in results["admitted"]:
        print(
            f"admitted, {row['clients']:>3} clients: {row['requests_per_s']:>7} req/s, "
            f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, statuses {row['statuses']}"
        )
    r = results["refused"]
    print(
        f"refused, burst of {r['burst']}: {r['refused']} 503s (other {r['other']}), "
        f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms"
    )
    save_results("admission", results)


if __name__ == "__main__":
    main()
