"""Metering overhead: requests/s with billing on against off, same machine, same run.

    .venv/bin/python -m bench.metering [--rounds 6] [--requests 400] [--concurrency 16]

Two platforms on the fake engine (the overhead is the frontdoor's, Redis's and the ledger
consumer's; a fast fake engine makes it as visible as it can be): one with metering on
(usage records, GPU-time segments, the ledger consumer folding them, and rate-limit
reservations for a key with limits), one with EBB_METERING=0 and a key without limits.
Each round measures both, in ABBA order so drift in machine load hits both alike; the
result is the median requests/s of each, the median of the per-round ratios, and the
platform's CPU time per request (all its processes), which a busy shared machine disturbs
far less than throughput. Results go to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.loadgen import LevelResult, run_level, save_results

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support import Platform, temp_home, wait_until  # noqa: E402

SOURCE = "fake://bench?ctx=4096&step_ms=1"


def start(metering: bool) -> tuple[Platform, str]:
    """A platform with one ready runner, and a tenant key for it."""
    platform = Platform(
        home=temp_home("ebb-bench-metering-"),
        redis_url=None,
        env_extra={"EBB_METERING": "1" if metering else "0", "EBB_GPU_METER_INTERVAL_S": "5"},
    ).start()
    limits = {"requests_per_minute": 10**7, "tokens_per_minute": 10**9} if metering else {}
    with platform.admin() as admin:
        admin.post(
            "/v1/deployments",
            json={
                "name": "bench",
                "source": SOURCE,
                "min_replicas": 1,
                "max_concurrency": 64,
                "idle_timeout_s": 3600,
                "input_micros_per_1m_tokens": 150_000,
                "output_micros_per_1m_tokens": 600_000,
                "micros_per_gpu_second": 278,
            },
        ).raise_for_status()
        created = admin.post("/v1/keys", json={"tenant": "bench", **limits})
        created.raise_for_status()
        wait_until(
            lambda: admin.get("/v1/deployments/bench").json()["status"] == "ready",
            120,
            "the bench runner to be ready",
        )
    return platform, created.json()["key"]


@dataclass
class Measurement:
    result: LevelResult
    cpu_s: float  # user + system time of every process of the platform, redis included

    @property
    def cpu_ms_per_request(self) -> float:
        return self.cpu_s * 1000 / len(self.result.samples)


def platform_cpu_s(platform: Platform) -> float:
    root = psutil.Process(platform.proc.pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def measure(platform: Platform, key: str, args: argparse.Namespace, requests: int) -> Measurement:
    before = platform_cpu_s(platform)
    result = asyncio.run(
        run_level(
            platform.base_url + "/v1",
            key,
            "bench",
            concurrency=args.concurrency,
            requests=requests,
            max_tokens=args.max_tokens,
        )
    )
    return Measurement(result, platform_cpu_s(platform) - before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=400, help="requests per measurement")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()

    platforms = {"on": start(metering=True), "off": start(metering=False)}
    results: dict[str, list[Measurement]] = {"on": [], "off": []}
    try:
        for platform, key in platforms.values():
            measure(platform, key, args, requests=2 * args.concurrency)  # warm-up
        for i in range(args.rounds):
            order = ("on", "off") if i % 2 == 0 else ("off", "on")
            for name in order:
                m = measure(*platforms[name], args, requests=args.requests)
                if m.result.errors:
                    raise SystemExit(f"{m.result.errors} requests failed with metering {name}")
                results[name].append(m)
                print(
                    f"round {i + 1} metering {name:>3}: {m.result.requests_per_s:8.1f} req/s, "
                    f"{m.cpu_ms_per_request:6.2f} CPU ms/request"
                )
    finally:
        for platform, _ in platforms.values():
            platform.stop()
    report(results, args)


def report(results: dict[str, list[Measurement]], args: argparse.Namespace) -> None:
    pairs = list(zip(results["on"], results["off"], strict=True))
    on = statistics.median(m.result.requests_per_s for m in results["on"])
    off = statistics.median(m.result.requests_per_s for m in results["off"])
    # Each round's two measurements ran back to back: their ratio cancels slow drift in the
    # machine's load, which the ratio of medians does not.
    ratio = statistics.median(a.result.requests_per_s / b.result.requests_per_s for a, b in pairs)
    # CPU time per request barely depends on what else the machine runs: on a shared
    # machine it is the steadier measure of the same overhead.
    cpu_on = statistics.median(m.cpu_ms_per_request for m in results["on"])
    cpu_off = statistics.median(m.cpu_ms_per_request for m in results["off"])
    summary = {
        "requests_per_s_on": round(on, 2),
        "requests_per_s_off": round(off, 2),
        "ratio_of_medians": round(on / off, 4),
        "median_round_ratio": round(ratio, 4),
        "overhead_pct": round((1 - ratio) * 100, 2),
        "cpu_ms_per_request_on": round(cpu_on, 3),
        "cpu_ms_per_request_off": round(cpu_off, 3),
        "cpu_overhead_pct": round((cpu_on / cpu_off - 1) * 100, 2),
        "rounds": [
            {
                "on": a.result.summary() | {"cpu_ms_per_request": round(a.cpu_ms_per_request, 3)},
                "off": b.result.summary() | {"cpu_ms_per_request": round(b.cpu_ms_per_request, 3)},
            }
            for a, b in pairs
        ],
    }
    print(
        f"median requests/s: metering on {on:.1f}, off {off:.1f} "
        f"(ratio of medians {on / off:.3f}); median per-round ratio {ratio:.3f} "
        f"(overhead {summary['overhead_pct']:+.1f}%)\n"
        f"median platform CPU per request: on {cpu_on:.2f} ms, off {cpu_off:.2f} ms "
        f"({summary['cpu_overhead_pct']:+.1f}%)"
    )
    save_results("metering", {"args": vars(args), **summary})


if __name__ == "__main__":
    main()
