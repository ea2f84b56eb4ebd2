"""Priority classes under overload, through the fake engine, in one run.

    .venv/bin/python -m bench.priority [--slots 4 --step-ms 25 --tokens 8 --seconds 20]

One deployment with one ready fake runner of `--slots` slots; each request streams
`--tokens` tokens, one per engine step of `--step-ms`, so the runner's capacity is
slots / (tokens × step) requests per second (measured, not assumed: a closed loop of
2 × slots clients first). Three tenants, one per class (critical, standard, sheddable,
set with PUT /v1/tenants/T/limits). Open-loop arrivals (Poisson, fixed seed):

1. baseline: critical alone at `--critical-share` of 2 × capacity;
2. overload: the same critical traffic plus standard at `--standard-share` and
   sheddable at the rest of 2 × capacity.

Reported: critical p50/p99 TTFT in both phases and their ratio (target: overload p99 ≤
1.2 × baseline p99), and the 503s by class (target: ≥ 95 % of them on sheddable), with
their codes (`shed` at admission, `admission_timeout` after waiting). The platform and
this load generator share the machine's cores: compare ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field

import httpx

from bench.loadgen import save_results
from bench.serving import REPO

sys.path.insert(0, str(REPO / "tests"))

from support import Platform, deploy, deployment, temp_home, wait_until  # noqa: E402

CLASSES = ("critical", "standard", "sheddable")
MODEL = "prio"


@dataclass
class ClassResult:
    ttft_s: list[float] = field(default_factory=list)
    refused: dict[str, int] = field(default_factory=dict)  # 503 code -> count
    other_errors: int = 0

    def row(self) -> dict:
        return {
            "served": len(self.ttft_s),
            "p50_ttft_ms": _ms(percentile(self.ttft_s, 0.50)),
            "p99_ttft_ms": _ms(percentile(self.ttft_s, 0.99)),
            "refused_503": dict(self.refused),
            "other_errors": self.other_errors,
        }


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _body(tokens: int) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "stream": True,
    }


async def one(client: httpx.AsyncClient, key: str, tokens: int, result: ClassResult) -> None:
    """One streamed request: its TTFT, or the 503 it got and why."""
    headers = {"Authorization": f"Bearer {key}"}
    sent = time.perf_counter()
    try:
        async with client.stream(
            "POST", "/v1/chat/completions", json=_body(tokens), headers=headers
        ) as response:
            if response.status_code == 503:
                code = json.loads(await response.aread())["error"]["code"]
                result.refused[code] = result.refused.get(code, 0) + 1
                return
            if response.status_code != 200:
                result.other_errors += 1
                return
            first = True
            async for line in response.aiter_lines():
                if first and line.startswith("data: ") and '"content"' in line:
                    result.ttft_s.append(time.perf_counter() - sent)
                    first = False
    except httpx.HTTPError:
        result.other_errors += 1


async def open_loop(
    base_url: str, rates: dict[str, float], keys: dict[str, str], tokens: int, seconds: float
) -> dict[str, ClassResult]:
    """Poisson arrivals per class at `rates` (requests/s) for `seconds`."""
    results = {c: ClassResult() for c in rates}
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:
        tasks: list[asyncio.Task[None]] = []

        async def arrivals(cls: str, rate: float, seed: int) -> None:
            rng = random.Random(seed)
            end = time.perf_counter() + seconds
            while (now := time.perf_counter()) < end:
                tasks.append(asyncio.create_task(one(client, keys[cls], tokens, results[cls])))
                await asyncio.sleep(max(0.0, rng.expovariate(rate) - (time.perf_counter() - now)))

        await asyncio.gather(
            *(arrivals(c, r, seed) for seed, (c, r) in enumerate(rates.items()) if r > 0)
        )
        await asyncio.gather(*tasks)
    return results


async def capacity(base_url: str, key: str, tokens: int, clients: int, seconds: float) -> float:
    """Requests/s a closed loop of `clients` gets through: the runner's real capacity."""
    done = 0
    end = time.perf_counter() + seconds
    result = ClassResult()
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < end:
                await one(client, key, tokens, result)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return done / (time.perf_counter() - started)


def setup(platform: Platform, args: argparse.Namespace) -> dict[str, str]:
    """The deployment, ready; one key per class, its tenant in that class."""
    keys = {}
    with platform.admin() as admin:
        deploy(
            admin,
            MODEL,
            source=f"fake://m?step_ms={args.step_ms}",
            min_replicas=1,
            max_replicas=1,
            max_concurrency=args.slots,
            queue_depth_limit=args.queue_depth,
        )
        for cls in CLASSES:
            tenant = f"bench-{cls}"
            admin.put(f"/v1/tenants/{tenant}/limits", json={"priority": cls}).raise_for_status()
            keys[cls] = admin.post("/v1/keys", json={"tenant": tenant, "name": cls}).json()["key"]
        wait_until(lambda: deployment(admin, MODEL)["replicas"]["ready"] == 1, 120, "runner")
    return keys


def summary(baseline: ClassResult, overload: dict[str, ClassResult]) -> dict:
    base_p99 = percentile(baseline.ttft_s, 0.99)
    over_p99 = percentile(overload["critical"].ttft_s, 0.99)
    refused = {c: sum(r.refused.values()) for c, r in overload.items()}
    total = sum(refused.values())
    return {
        "critical_p99_ratio": None
        if not (base_p99 and over_p99)
        else round(over_p99 / base_p99, 2),
        "refused_by_class": refused,
        "sheddable_share_of_503s": None if not total else round(refused["sheddable"] / total, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=25)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--queue-depth", type=int, default=64)
    parser.add_argument("--critical-share", type=float, default=0.2)
    parser.add_argument("--standard-share", type=float, default=0.2)
    args = parser.parse_args()

    platform = Platform(
        home=temp_home("ebb-bench-priority-"),
        redis_url=None,
        env_extra={"EBB_TEST_ENGINES": "1"},
    ).start()
    try:
        keys = setup(platform, args)
        url = platform.base_url
        measured = asyncio.run(
            capacity(url, keys["standard"], args.tokens, 2 * args.slots, args.seconds / 2)
        )
        offered = 2 * measured
        rates = {
            "critical": offered * args.critical_share,
            "standard": offered * args.standard_share,
            "sheddable": offered * (1 - args.critical_share - args.standard_share),
        }
        baseline = asyncio.run(
            open_loop(url, {"critical": rates["critical"]}, keys, args.tokens, args.seconds)
        )["critical"]
        overload = asyncio.run(open_loop(url, rates, keys, args.tokens, args.seconds))
    finally:
        platform.stop()
    results = {
        "config": vars(args),
        "capacity_requests_per_s": round(measured, 2),
        "offered_requests_per_s": {c: round(r, 2) for c, r in rates.items()},
        "baseline_critical_alone": baseline.row(),
        "overload": {c: r.row() for c, r in overload.items()},
        **summary(baseline, overload),
    }
    print(json.dumps(results, indent=2))
    print(
        f"critical p99 TTFT under 2x overload / alone: {results['critical_p99_ratio']} "
        f"(target <= 1.2); sheddable share of 503s: {results['sheddable_share_of_503s']} "
        "(target >= 0.95)"
    )
    save_results("priority", results)


if __name__ == "__main__":
    main()
