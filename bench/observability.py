"""Observability overhead: requests/s with tracing exported and /metrics scraped, against
neither, same machine, same run.

    .venv/bin/python -m bench.observability [--rounds 6] [--requests 200] [--concurrency 32]
        [--sample-ratio 1.0] [--scrape-interval 15] [--real]

Two platforms, driven with streamed chat requests: on the fake engine by default (the
overhead is the frontdoor's and the runner's; a fast fake engine makes it as visible as
it can be), or with --real on the real engine serving the default model (serving
throughput as a user sees it):
  on    EBB_OTLP_ENDPOINT set (every request's spans exported, OTLP/HTTP, to a local
        sink that accepts them) and /metrics scraped every --scrape-interval seconds
        while measuring (15: infra/observability's Prometheus; 1 stresses the scrape);
  off   no tracing, nobody scraping.
Request metrics themselves (counters and histograms, the access-log line, the runner's
once-a-second engine figures) are recorded in both: they cannot be switched off, so this
measures what an operator turns on. Rounds alternate the order; the result is the median
of the per-round ratios. Results go to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from bench.loadgen import LevelResult, run_level, save_results
from bench.metering import platform_cpu_s

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support import TEST_WEIGHTS_DIR, Platform, temp_home, wait_until  # noqa: E402

from bench.serving import KV_CACHE_GIB, MAX_MODEL_LEN  # noqa: E402
from ebb.config import DEFAULT_MODEL_SOURCE  # noqa: E402
from ebb.weights_cache import ensure  # noqa: E402

FAKE_SOURCE = "fake://bench?ctx=4096&step_ms=1"


class OtlpSink:
    """Accepts OTLP/HTTP exports on 127.0.0.1 and counts them (a collector's front)."""

    def __init__(self) -> None:
        sink = self
        self.exports = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("content-length", 0)))
                sink.exports += 1
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()


class Scraper:
    """Fetches /metrics every `interval_s`, as Prometheus would, while running (and once
    at the start, so even a short measurement pays for one scrape)."""

    def __init__(self, base_url: str, token: str, interval_s: float) -> None:
        self._url = base_url + "/metrics"
        self._interval_s = interval_s
        self._headers = {"Authorization": f"Bearer {token}"}
        self._stop = threading.Event()
        self.scrapes = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while True:
                client.get(self._url, headers=self._headers).raise_for_status()
                self.scrapes += 1
                if self._stop.wait(self._interval_s):
                    return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def start(env: dict[str, str], *, real: bool) -> Platform:
    engine_env = (
        {"EBB_WEIGHTS_CACHE_DIR": str(TEST_WEIGHTS_DIR), "EBB_KV_CACHE_GIB": KV_CACHE_GIB}
        if real
        else {"EBB_TEST_ENGINES": "1"}
    )
    platform = Platform(
        home=temp_home("ebb-bench-observe-"),
        redis_url=None,
        env_extra={**engine_env, "OTEL_BSP_SCHEDULE_DELAY": "500", **env},
    ).start()
    deployment = {"name": "bench", "min_replicas": 1, "idle_timeout_s": 3600}
    if real:
        deployment |= {
            "source": DEFAULT_MODEL_SOURCE,
            "max_concurrency": 32,
            "max_model_len": MAX_MODEL_LEN,
        }
    else:
        deployment |= {"source": FAKE_SOURCE, "max_concurrency": 64}
    with platform.admin() as admin:
        admin.post("/v1/deployments", json=deployment).raise_for_status()
        wait_until(
            lambda: admin.get("/v1/deployments/bench").json()["status"] == "ready",
            600 if real else 120,
            "the bench runner to be ready",
            poll_s=0.5,
        )
    return platform


def measure(
    platform: Platform, args: argparse.Namespace, requests: int, scrape: bool
) -> tuple[LevelResult, dict[str, float]]:
    """The level's result and the platform's CPU ms per request, by process."""
    scraper = (
        Scraper(platform.base_url, platform.admin_key, args.scrape_interval) if scrape else None
    )
    before = platform_cpu_s(platform)
    try:
        result = asyncio.run(
            run_level(
                platform.base_url + "/v1",
                platform.admin_key,
                "bench",
                concurrency=args.concurrency,
                requests=requests,
                max_tokens=args.max_tokens,
            )
        )
    finally:
        if scraper is not None:
            scraper.stop()
    after = platform_cpu_s(platform)
    cpu_ms = {role: (after[role] - before[role]) * 1000 / requests for role in after}
    return result, cpu_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=200, help="requests per measurement")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--sample-ratio", type=float, default=1.0, help="EBB_OTLP_SAMPLE_RATIO of the on platform"
    )
    parser.add_argument(
        "--scrape-interval", type=float, default=15.0, help="seconds between /metrics scrapes"
    )
    parser.add_argument(
        "--real", action="store_true", help="the real engine on the default model, not fake"
    )
    args = parser.parse_args()
    if args.real:
        ensure(DEFAULT_MODEL_SOURCE, TEST_WEIGHTS_DIR)  # converted once, before either starts

    sink = OtlpSink()
    traced = {"EBB_OTLP_ENDPOINT": sink.url, "EBB_OTLP_SAMPLE_RATIO": str(args.sample_ratio)}
    platforms = {"on": start(traced, real=args.real), "off": start({}, real=args.real)}
    results: dict[str, list[LevelResult]] = {"on": [], "off": []}
    cpu: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    try:
        for name, platform in platforms.items():
            measure(platform, args, 2 * args.concurrency, scrape=name == "on")  # warm-up
        for i in range(args.rounds):
            for name in ("on", "off") if i % 2 == 0 else ("off", "on"):
                result, cpu_ms = measure(platforms[name], args, args.requests, scrape=name == "on")
                if result.errors:
                    raise SystemExit(f"{result.errors} requests failed ({name})")
                results[name].append(result)
                cpu[name].append(cpu_ms)
                print(
                    f"round {i + 1:>2} {name:>3}: {result.requests_per_s:7.1f} req/s, "
                    f"{sum(cpu_ms.values()):5.2f} CPU ms/request"
                )
    finally:
        for platform in platforms.values():
            platform.stop()
        sink.stop()
    ratio = statistics.median(
        a.requests_per_s / b.requests_per_s
        for a, b in zip(results["on"], results["off"], strict=True)
    )
    rps = {n: statistics.median(r.requests_per_s for r in rs) for n, rs in results.items()}
    roles = sorted({role for rounds in cpu.values() for c in rounds for role in c})
    cpu_by_role = {
        n: {r: round(statistics.median(c.get(r, 0.0) for c in rounds), 3) for r in roles}
        for n, rounds in cpu.items()
    }
    cpu_total = {n: round(sum(by.values()), 3) for n, by in cpu_by_role.items()}
    if sink.exports == 0:
        raise SystemExit("tracing was on but no spans reached the OTLP sink")
    print(
        f"median requests/s: on {rps['on']:.1f}, off {rps['off']:.1f}\n"
        f"median per-round ratio on/off {ratio:.3f} (overhead {(1 - ratio) * 100:+.1f}%); "
        f"{sink.exports} OTLP exports received\n"
        f"median CPU ms per request: on {cpu_total['on']:.2f}, off {cpu_total['off']:.2f}"
        + "".join(f"\n  {n} by process: {cpu_by_role[n]}" for n in cpu_by_role)
    )
    save_results(
        "observability",
        {
            "args": vars(args),
            "requests_per_s": rps,
            "ratio_on_off": round(ratio, 4),
            "overhead_pct": round((1 - ratio) * 100, 2),
            "otlp_exports": sink.exports,
            "cpu_ms_per_request": cpu_total,
            "cpu_ms_per_request_by_process": cpu_by_role,
            "rounds": {n: [r.summary() for r in rs] for n, rs in results.items()},
        },
    )


if __name__ == "__main__":
    main()
