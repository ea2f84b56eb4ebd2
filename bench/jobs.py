"""Async jobs benchmark: a job against the same request made synchronously, in the same run,
then the reliability figure across a restart of every ebb process and Redis.

    .venv/bin/python -m bench.jobs [--engine fake|real] [--requests 48] [--concurrency 8]
                                   [--skip-reliability]

Overhead: the same chat request is sent in alternating blocks as a synchronous call and as
a job with a webhook to a local receiver, to a runner that is already up. Reported: median
latency (sync: the answer; job: submit until the signed job.succeeded webhook arrives),
throughput at the given concurrency, and the ratios job/sync.
Reliability: jobs keep arriving while the frontdoor, controller and webhooks worker are
killed (SIGKILL, `ebb up` restarts them) and Redis is restarted from its append-only file;
reported: submitted / finished / retrievable / delivered / billed. Results go to
bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support import (  # noqa: E402
    TEST_WEIGHTS_DIR,
    Platform,
    RedisServer,
    free_port,
    temp_home,
    wait_until,
)
from support.reliability import run_restart_scenario  # noqa: E402
from support.webhook_receiver import Receiver  # noqa: E402

from ebb.config import DEFAULT_MODEL_SOURCE  # noqa: E402

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
SOURCES = {"fake": "fake://bench?step_ms=5", "real": DEFAULT_MODEL_SOURCE}


@dataclass
class Block:
    mode: str
    latencies_s: list[float]
    wall_s: float

    @property
    def per_s(self) -> float:
        return len(self.latencies_s) / self.wall_s


async def sync_call(client: httpx.AsyncClient, body: dict, receiver: Receiver) -> float:
    started = time.monotonic()
    response = await client.post("/v1/chat/completions", json=body["body"] | {"model": "b"})
    response.raise_for_status()
    return time.monotonic() - started


async def job_call(client: httpx.AsyncClient, body: dict, receiver: Receiver) -> float:
    started = time.monotonic()
    response = await client.post("/v1/jobs", json=body)
    response.raise_for_status()
    job_id = response.json()["id"]
    while not receiver.accepted(job_id, "job.succeeded"):
        await asyncio.sleep(0.005)
    return time.monotonic() - started


async def run_block(platform, mode, body, receiver, requests, concurrency) -> Block:
    call = sync_call if mode == "sync" else job_call
    latencies: list[float] = []
    remaining = iter(range(requests))
    headers = {"Authorization": f"Bearer {platform.admin_key}"}
    async with httpx.AsyncClient(base_url=platform.base_url, headers=headers, timeout=600) as c:

        async def worker() -> None:
            for _ in remaining:
                latencies.append(await call(c, body, receiver))

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Block(mode, latencies, time.monotonic() - started)


def overhead(platform: Platform, receiver: Receiver, args) -> dict:
    body = {
        "model": "b",
        "endpoint": "chat.completions",
        "body": {"messages": QUESTION, "max_tokens": args.max_tokens, "temperature": 0},
        "webhook": {"url": receiver.url, "events": ["job.succeeded"]},
    }
    asyncio.run(run_block(platform, "sync", body, receiver, 4, 2))  # warm the runner
    blocks: dict[str, list[Block]] = {}
    for level in (1, args.concurrency):
        for mode in ("sync", "job", "job", "sync"):  # ABBA: drift hits both alike
            block = asyncio.run(
                run_block(platform, mode, body, receiver, args.requests // 2, level)
            )
            blocks.setdefault(f"{mode}@{level}", []).append(block)
    rows = {}
    for level in (1, args.concurrency):
        sync = blocks[f"sync@{level}"]
        job = blocks[f"job@{level}"]
        sync_median = statistics.median(x for b in sync for x in b.latencies_s)
        job_median = statistics.median(x for b in job for x in b.latencies_s)
        sync_rate = sum(len(b.latencies_s) for b in sync) / sum(b.wall_s for b in sync)
        job_rate = sum(len(b.latencies_s) for b in job) / sum(b.wall_s for b in job)
        rows[level] = {
            "sync_median_ms": round(sync_median * 1000, 1),
            "job_to_webhook_median_ms": round(job_median * 1000, 1),
            "latency_ratio": round(job_median / sync_median, 2),
            "sync_per_s": round(sync_rate, 2),
            "job_per_s": round(job_rate, 2),
            "throughput_ratio": round(job_rate / sync_rate, 2),
        }
        print(
            f"concurrency {level:>2}: sync {rows[level]['sync_median_ms']:>7.1f} ms, "
            f"job->webhook {rows[level]['job_to_webhook_median_ms']:>7.1f} ms "
            f"(ratio {rows[level]['latency_ratio']:.2f}); throughput sync "
            f"{sync_rate:.2f}/s, jobs {job_rate:.2f}/s (ratio {rows[level]['throughput_ratio']})"
        )
    return rows


def reliability(platform: Platform, redis_server: RedisServer, args) -> dict:
    # Every event's first attempt is refused: deliveries are mid-schedule at each restart.
    receiver = Receiver(fail_first=1).start()
    try:
        figure = run_restart_scenario(
            platform,
            redis_server,
            receiver,
            {
                "model": "b",
                "endpoint": "chat.completions",
                "body": {"messages": QUESTION, "max_tokens": args.max_tokens},
                "webhook": {"url": receiver.url},
            },
        )
    finally:
        receiver.stop()
    print("reliability:", figure.line(), "holds" if figure.holds else "BROKEN")
    return {**vars(figure), "holds": figure.holds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=sorted(SOURCES), default="fake")
    parser.add_argument("--requests", type=int, default=48, help="per mode and level")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--skip-reliability", action="store_true")
    args = parser.parse_args()

    work = temp_home("ebb-bench-jobs-")
    redis_server = RedisServer(port=free_port(), data_dir=work / "redis")
    redis_server.data_dir.mkdir()
    redis_server.start()
    platform = Platform(
        home=work / "ebb",
        redis_url=redis_server.url,
        env_extra={
            # --engine fake deploys a fake:// source: a test engine, off unless asked for.
            "EBB_TEST_ENGINES": "1",
            "EBB_WEIGHTS_CACHE_DIR": str(TEST_WEIGHTS_DIR),
            "EBB_WEBHOOK_ALLOWED_CIDRS": "127.0.0.0/8",
            "EBB_WEBHOOK_RETRY_BASE_S": "0.2",
            "EBB_WEBHOOK_RETRY_MAX_DELAY_S": "1",
        },
    ).start()
    receiver = Receiver().start()
    results: dict = {"args": vars(args)}
    try:
        with platform.admin() as admin:
            created = admin.post(
                "/v1/deployments",
                json={
                    "name": "b",
                    "source": SOURCES[args.engine],
                    "max_concurrency": 32,
                    "min_replicas": 1,
                    "idle_timeout_s": 3600,
                },
            )
            created.raise_for_status()
            wait_until(
                lambda: admin.get("/v1/deployments/b").json()["status"] == "ready",
                600,
                "a ready runner (both modes are measured warm)",
            )
        results["overhead"] = overhead(platform, receiver, args)
        if not args.skip_reliability:
            results["reliability"] = reliability(platform, redis_server, args)
    finally:
        receiver.stop()
        platform.stop()
        redis_server.stop()
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"jobs-{args.engine}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2, default=str))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
