"""Metering overhead: requests/s with billing on against off, same machine, same run.

    .venv/bin/python -m bench.metering [--rounds 12] [--requests 200] [--concurrency 16]

Three platforms on the fake engine (the overhead is the frontdoor's, Redis's and the
ledger consumer's; a fast fake engine makes it as visible as it can be), driven by one
tenant key each with streamed chat requests:
  on    metering on: usage records, GPU-time segments, the ledger consumer folding them;
        the key has rate limits (a reservation per request);
  off   EBB_METERING=0, the same rate limits: on/off is the metering overhead;
  bare  EBB_METERING=0 and a key without limits: on/bare is billing's whole overhead.
Each round measures all three back to back, in an order that rotates from round to round
so drift in the machine's load hits each alike; the results are the medians of the
per-round ratios. The platform's CPU time per request is reported too, in all and by
process: on a machine shared with other work it moves far less than throughput does, and
it shows where the overhead goes. Results go to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.loadgen import LevelResult, run_level, save_results

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support import Platform, temp_home, wait_until  # noqa: E402

SOURCE = "fake://bench?ctx=4096&step_ms=1"
LIMITS = {"requests_per_minute": 10**7, "tokens_per_minute": 10**9}
VARIANTS = {"on": (True, LIMITS), "off": (False, LIMITS), "bare": (False, {})}


def start(metering: bool, limits: dict) -> tuple[Platform, str]:
    """A platform with one ready runner, and a tenant key for it."""
    platform = Platform(
        home=temp_home("ebb-bench-metering-"),
        redis_url=None,
        env_extra={
            "EBB_METERING": "1" if metering else "0",
            "EBB_GPU_METER_INTERVAL_S": "5",
            # SOURCE is a fake:// source: a test engine, off unless asked for.
            "EBB_TEST_ENGINES": "1",
        },
    ).start()
    with platform.admin() as admin:
        admin.post(
            "/v1/deployments",
            json={
                "name": "bench",
                "source": SOURCE,
                "min_replicas": 1,
                "max_concurrency": 64,
                "idle_timeout_s": 3600,
                "price_per_1m_input_tokens_micros": 150_000,
                "price_per_1m_output_tokens_micros": 600_000,
                "price_per_gpu_second_micros": 278,
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
    cpu_s: dict[str, float]  # user + system time per process of the platform, redis included

    @property
    def cpu_ms_per_request(self) -> float:
        return sum(self.cpu_s.values()) * 1000 / len(self.result.samples)

    def cpu_ms_per_request_of(self, process: str) -> float:
        return self.cpu_s.get(process, 0.0) * 1000 / len(self.result.samples)


def platform_cpu_s(platform: Platform) -> Counter:
    """CPU seconds so far of each process of the platform, by role (frontdoor, runner...)."""
    root = psutil.Process(platform.proc.pid)
    used: Counter = Counter()
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            argv = proc.cmdline()
            role = "redis" if "redis-server" in argv[0] else _ebb_command(argv)
            times = proc.cpu_times()
            used[role] += times.user + times.system
    return used


def _ebb_command(argv: list[str]) -> str:
    return argv[argv.index("ebb") + 1] if "ebb" in argv[:-1] else "other"


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
    after = platform_cpu_s(platform)
    return Measurement(result, {role: after[role] - before[role] for role in after})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--requests", type=int, default=200, help="requests per measurement")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()

    platforms = {name: start(*variant) for name, variant in VARIANTS.items()}
    results: dict[str, list[Measurement]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    try:
        for platform, key in platforms.values():
            measure(platform, key, args, requests=2 * args.concurrency)  # warm-up
        for i in range(args.rounds):
            for name in names[i % 3 :] + names[: i % 3]:
                m = measure(*platforms[name], args, requests=args.requests)
                if m.result.errors:
                    raise SystemExit(f"{m.result.errors} requests failed ({name})")
                results[name].append(m)
                print(
                    f"round {i + 1:>2} {name:>4}: {m.result.requests_per_s:7.1f} req/s, "
                    f"{m.cpu_ms_per_request:5.2f} CPU ms/request"
                )
    finally:
        for platform, _ in platforms.values():
            platform.stop()
    report(results, args)


def _round_ratio(a: list[Measurement], b: list[Measurement]) -> float:
    """The median over rounds of a's requests/s over b's, measured moments apart."""
    return statistics.median(
        x.result.requests_per_s / y.result.requests_per_s for x, y in zip(a, b, strict=True)
    )


def report(results: dict[str, list[Measurement]], args: argparse.Namespace) -> None:
    rps = {n: statistics.median(m.result.requests_per_s for m in ms) for n, ms in results.items()}
    cpu = {n: statistics.median(m.cpu_ms_per_request for m in ms) for n, ms in results.items()}
    roles = sorted({role for ms in results.values() for m in ms for role in m.cpu_s})
    by_role = {
        n: {r: round(statistics.mean(m.cpu_ms_per_request_of(r) for m in ms), 3) for r in roles}
        for n, ms in results.items()
    }
    metering = _round_ratio(results["on"], results["off"])
    billing = _round_ratio(results["on"], results["bare"])
    summary = {
        "requests_per_s": {n: round(v, 2) for n, v in rps.items()},
        "cpu_ms_per_request": {n: round(v, 3) for n, v in cpu.items()},
        "cpu_ms_per_request_by_process": by_role,
        "ratio_on_off": round(metering, 4),
        "ratio_on_bare": round(billing, 4),
        "metering_overhead_pct": round((1 - metering) * 100, 2),
        "billing_overhead_pct": round((1 - billing) * 100, 2),
        "rounds": {
            n: [m.result.summary() | {"cpu_ms_per_request": m.cpu_ms_per_request} for m in ms]
            for n, ms in results.items()
        },
    }
    print(
        "median requests/s: "
        + ", ".join(f"{n} {v:.1f}" for n, v in rps.items())
        + "\nmedian CPU ms per request: "
        + ", ".join(f"{n} {v:.2f}" for n, v in cpu.items())
        + "".join(f"\n  {n} CPU ms per request by process: {by_role[n]}" for n in by_role)
        + f"\nmedian per-round ratio on/off  {metering:.3f} (metering overhead "
        f"{summary['metering_overhead_pct']:+.1f}%)"
        + f"\nmedian per-round ratio on/bare {billing:.3f} (metering + rate limits "
        f"{summary['billing_overhead_pct']:+.1f}%)"
    )
    save_results("metering", {"args": vars(args), **summary})


if __name__ == "__main__":
    main()
