"""Admission at speed: what one frontdoor admits and refuses, through the fake engine.

    .venv/bin/python -m bench.admission [--clients 16 64 --requests 2000 --burst 200]
                                        [--bursts 5] [--workers 2] [--as-tenant]
                                        [--budget-micros N]

Admitted: closed-loop clients send non-streamed chat requests (one output token) to a
deployment with one ready fake runner (step 0 ms, 256 slots); requests/s end to end and
the latency each request saw (p50, p99). Refused: bursts of clients at once at a
deployment whose queue is full (its runner is inside its load), each answered 503 at once
without waiting for the admission window, sent once the platform is quiet again (billing
has priced the admitted runs); p50/p99 of each burst's answers, and their
medians over the bursts (one burst alone is at the mercy of this machine's neighbours).
The platform runs the test engines (EBB_TEST_ENGINES=1), on this machine's cores beside
the load generator, so the numbers are for that whole machine. Beside each rate, the CPU
milliseconds each process (frontdoor, runner, redis, controller) spent per request: on a
busy machine those move far less than wall-clock rates do.

With `--as-tenant` the requests carry a tenant's key rather than the admin key, so each
one also passes its rate limits, priority class and spend cap (the admin key skips them);
`--budget-micros N` gives that tenant a monthly budget of N micros, large enough that it
never refuses, so the budget is reserved and settled on every request.

With `--workers N` the platform's frontdoor runs N processes (EBB_FRONTDOOR_WORKERS),
and a second, single-process frontdoor on the same Redis is measured against it in the
same run (admitted requests/s at the largest client count, alternated twice).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import threading
import time

import httpx
import psutil

from bench.footprint import role_of
from bench.loadgen import save_results
from bench.rawhttp import RawConnection
from bench.serving import REPO

sys.path.insert(0, str(REPO / "tests"))

from support import Platform, deploy, deployment, free_port, temp_home, wait_until  # noqa: E402

MESSAGES = [{"role": "user", "content": "hi"}]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def admitted(base_url: str, key: str, clients: int, requests: int) -> dict:
    """`clients` keep-alive connections sending back to back until `requests` were sent."""
    body = {"model": "fast", "messages": MESSAGES, "max_tokens": 1}
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    pending = iter(range(requests))

    async def worker() -> None:
        connection = RawConnection(base_url, _auth(key))
        request = connection.request_bytes("/v1/chat/completions", body)
        try:
            for _ in pending:
                sent = time.perf_counter()
                status, _ = await connection.send(request)
                latencies.append(time.perf_counter() - sent)
                statuses[status] = statuses.get(status, 0) + 1
        finally:
            await connection.close()

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


async def refused(base_url: str, key: str, burst: int) -> dict:
    """`burst` clients at once, each on its own connection (opened before the burst)."""
    body = {"model": "full", "messages": MESSAGES, "max_tokens": 1}
    connections = [RawConnection(base_url, _auth(key)) for _ in range(burst)]
    request = connections[0].request_bytes("/v1/chat/completions", body)
    for connection in connections:  # connected, so the burst measures answers only
        await connection.connect()
    # This process's own garbage (the admitted runs' latencies, connections) is collected
    # before the burst, not in the middle of it: the burst measures the frontdoor.
    gc.collect()

    async def one(connection: RawConnection) -> tuple[int, float]:
        sent = time.perf_counter()
        status, _ = await connection.send(request)
        return status, time.perf_counter() - sent

    try:
        results = await asyncio.gather(*(one(c) for c in connections))
    finally:
        for connection in connections:
            await connection.close()
    refusals = [s for code, s in results if code == 503]
    return {
        "burst": burst,
        "refused": len(refusals),
        "other": len(results) - len(refusals),
        "p50_ms": round(statistics.median(refusals) * 1000, 1) if refusals else None,
        "p99_ms": round(percentile(refusals, 0.99) * 1000, 1) if refusals else None,
    }


def medians(bursts: list[dict]) -> dict:
    """Several bursts' answers: all of them counted, their p50/p99 the bursts' medians."""

    def median_of(key: str) -> float:
        return round(statistics.median(b[key] for b in bursts if b[key] is not None), 1)

    return {
        "burst": bursts[0]["burst"],
        "refused": sum(b["refused"] for b in bursts),
        "other": sum(b["other"] for b in bursts),
        "p50_ms": median_of("p50_ms"),
        "p99_ms": median_of("p99_ms"),
        "bursts": bursts,
    }


def cpu_s_by_role(platform: Platform) -> dict[str, float]:
    """CPU seconds (user + system) each role's processes have used so far."""
    root = psutil.Process(platform.proc.pid)
    used: dict[str, float] = {}
    for proc in root.children(recursive=True):
        try:
            role, times = role_of(proc), proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        used[role] = used.get(role, 0.0) + times.user + times.system
    return used


def settle(platform: Platform, timeout_s: float = 120) -> None:
    """Wait until the platform's processes are quiet (under 5 % of a core over half a
    second): after the admitted runs, the billing worker is still pricing their ledger
    entries, and a burst measured beside it measures this machine's two cores."""
    deadline = time.monotonic() + timeout_s
    used = sum(cpu_s_by_role(platform).values())
    while time.monotonic() < deadline:
        time.sleep(0.5)  # the sampling window
        previous, used = used, sum(cpu_s_by_role(platform).values())
        if used - previous < 0.025:
            return
    raise TimeoutError(f"the platform was still busy after {timeout_s} s")


def cpu_ms_per_request(platform: Platform, run, requests: int) -> tuple[dict, dict]:
    """`run()`'s result and the CPU milliseconds per request each role spent on it: a
    figure the machine's other load does not move the way wall-clock rates move."""
    before = cpu_s_by_role(platform)
    result = run()
    after = cpu_s_by_role(platform)
    per_request = {
        role: round((after[role] - before.get(role, 0.0)) * 1000 / requests, 3)
        for role in after
        if role in ("frontdoor", "runner", "redis", "coldstart", "stem")
    }
    return result, per_request


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def fill_queue(platform: Platform, depth: int) -> None:
    """Queue `depth` requests at `full` (its runner is still loading) and leave them waiting."""
    body = {"model": "full", "messages": MESSAGES, "max_tokens": 1}

    async def park() -> None:
        async with httpx.AsyncClient(
            base_url=platform.base_url, headers=_auth(platform.admin_key), timeout=600
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
        # Its runner's process start (imports, ~0.1 s of CPU on these 2 cores) is a cold
        # start's cost, not a refusal's: the bursts begin once it is inside its load.
        wait_until(
            lambda: deployment(admin, "full")["replicas"]["loading"] == 1, 60, "its runner to load"
        )


def workers_vs_one(platform: Platform, workers: int, clients: int, requests: int) -> dict:
    """Admitted requests/s through `platform` (EBB_FRONTDOOR_WORKERS=workers) and through
    one more single-process frontdoor on the same Redis, alternated twice, same runner."""
    port = free_port()
    log = open(platform.home / "frontdoor-single.log", "wb")  # noqa: SIM115 - closed below
    single = subprocess.Popen(
        [sys.executable, "-m", "ebb", "frontdoor"],
        env={
            **platform.env(),
            "EBB_PORT": str(port),
            "EBB_FRONTDOOR_WORKERS": "1",
            "EBB_REDIS_URL": json.loads((platform.home / "run.json").read_text())["redis_url"],
        },
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    single_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(single_url), 60, "the single-process frontdoor")
        rates: dict[str, list[float]] = {"1": [], str(workers): []}
        for _ in range(2):
            for name, url in (("1", single_url), (str(workers), platform.base_url)):
                row = asyncio.run(admitted(url, platform.admin_key, clients, requests))
                rates[name].append(row["requests_per_s"])
    finally:
        single.terminate()
        single.wait(timeout=60)
        log.close()
    best = {name: max(values) for name, values in rates.items()}
    return {
        "clients": clients,
        "requests_per_s": rates,
        "ratio": round(best[str(workers)] / best["1"], 2),
    }


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def tenant_key(admin: httpx.Client, budget_micros: int) -> str:
    """A key of the tenant `bench` (deployments are public: it may call them), with a
    monthly budget of `budget_micros` when above 0."""
    key = admin.post("/v1/keys", json={"tenant": "bench"}).json()["key"]
    if budget_micros:
        budget = {"amount_micros": budget_micros, "period": "month"}
        admin.put("/v1/tenants/bench/limits", json={"budget": budget}).raise_for_status()
    return key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--bursts", type=int, default=5, help="bursts of refusals, one by one")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="EBB_FRONTDOOR_WORKERS; above 1, also compares against one process",
    )
    parser.add_argument("--as-tenant", action="store_true", help="a tenant's key, not the admin's")
    parser.add_argument("--budget-micros", type=int, default=0, help="with --as-tenant")
    args = parser.parse_args()

    platform = Platform(
        home=temp_home("ebb-bench-admission-"),
        redis_url=None,
        env_extra={"EBB_TEST_ENGINES": "1", "EBB_FRONTDOOR_WORKERS": str(args.workers)},
    ).start()
    results: dict = {
        "workers": args.workers,
        "as_tenant": args.as_tenant,
        "budget_micros": args.budget_micros,
        "admitted": [],
        "refused": None,
    }
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
            key = tenant_key(admin, args.budget_micros) if args.as_tenant else platform.admin_key
        url = platform.base_url
        asyncio.run(admitted(url, key, 4, 100))  # warm the frontdoor and the runner
        for clients in args.clients:
            row, cpu = cpu_ms_per_request(
                platform,
                lambda c=clients: asyncio.run(admitted(url, key, c, args.requests)),
                args.requests,
            )
            results["admitted"].append({**row, "cpu_ms_per_request": cpu})
        fill_queue(platform, 8)
        settle(platform)
        rows, cpu = cpu_ms_per_request(
            platform,
            lambda: [asyncio.run(refused(url, key, args.burst)) for _ in range(args.bursts)],
            args.burst * args.bursts,
        )
        results["refused"] = {**medians(rows), "cpu_ms_per_request": cpu}
        if args.workers > 1:
            results["workers_vs_one"] = workers_vs_one(
                platform, args.workers, max(args.clients), args.requests
            )
    finally:
        platform.stop()
    for row in results["admitted"]:
        print(
            f"admitted, {row['clients']:>3} clients: {row['requests_per_s']:>7} req/s, "
            f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, statuses {row['statuses']}, "
            f"CPU ms/request {row['cpu_ms_per_request']}"
        )
    r = results["refused"]
    print(
        f"refused, {len(r['bursts'])} bursts of {r['burst']}: {r['refused']} 503s "
        f"(other {r['other']}), median p50 {r['p50_ms']} ms, median p99 {r['p99_ms']} ms "
        f"(each burst's p99: {[b['p99_ms'] for b in r['bursts']]}), "
        f"CPU ms/request {r['cpu_ms_per_request']}"
    )
    if compared := results.get("workers_vs_one"):
        print(
            f"{args.workers} frontdoor processes vs 1, {compared['clients']} clients: "
            f"{compared['requests_per_s']} req/s, best ratio {compared['ratio']}"
        )
    save_results("admission", results)


if __name__ == "__main__":
    main()
