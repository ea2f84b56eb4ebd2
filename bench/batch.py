"""Batch API benchmark: a batch against the same requests sent synchronously, same platform,
same run; and what a batch running alongside does to synchronous time to first token.

    .venv/bin/python -m bench.batch [--requests 500] [--max-tokens 16] [--probe 32]

One ebb platform, one runner of the default model (max_concurrency 32, eager, on CPU
here). Every request is the same kind of chat request (`min_tokens = max_tokens`, so each
makes exactly `--max-tokens` tokens). Phases, in order:
  1. synchronous: `--requests` streamed requests at concurrency 32 -> output tokens/s;
  2. batch: the same requests as one batch (files.create + batches.create), timed from
     creation until the API shows it completed -> output tokens/s (target: not slower);
  3. probe alone: `--probe` streamed requests at concurrency 4 -> median TTFT;
  4. probe with a batch of `--requests` lines running (started first, measured once its
     lines run), then the batch is cancelled -> median TTFT (target: at most +10 %);
  5. probe alone again (3 and 5 bracket 4 against drift).
`--job-slots-beside-sync 0` runs the platform with EBB_JOB_SLOTS_BESIDE_SYNC=0 (jobs take
no new slot while a synchronous request runs). Results go to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

from bench.loadgen import TOPICS, Sample, save_results, stream_one
from bench.serving import start_ebb

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support import Platform, temp_home, wait_until  # noqa: E402

SETTLED = ("completed", "expired", "cancelled", "failed")


def body(i: int, max_tokens: int) -> dict:
    return {
        "model": "smol",
        "messages": [{"role": "user", "content": f"Write a short story about {TOPICS[i % 16]}."}],
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "temperature": 0,
    }


async def synchronous(
    platform: Platform, *, requests: int, concurrency: int, max_tokens: int
) -> tuple[float, list[Sample], int]:
    """(wall seconds, samples, errors) of `requests` streamed requests."""
    url = platform.base_url + "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {platform.admin_key}"}
    counter = iter(range(requests))
    samples: list[Sample] = []
    errors = 0
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(headers=headers, timeout=600, limits=limits) as client:

        async def worker() -> None:
            nonlocal errors
            for i in counter:
                streamed = body(i, max_tokens) | {
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                try:
                    samples.append(await stream_one(client, url, streamed))
                except httpx.HTTPError:
                    errors += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - start, samples, errors


def create_batch(admin: httpx.Client, *, requests: int, max_tokens: int) -> str:
    lines = [
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": body(i, max_tokens),
            }
        )
        for i in range(requests)
    ]
    content = ("\n".join(lines) + "\n").encode()
    uploaded = admin.post(
        "/v1/files", files={"file": ("bench.jsonl", content)}, data={"purpose": "batch"}
    )
    uploaded.raise_for_status()
    created = admin.post(
        "/v1/batches",
        json={
            "input_file_id": uploaded.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    )
    created.raise_for_status()
    return created.json()["id"]


def settled(admin: httpx.Client, batch_id: str, timeout_s: float = 3600) -> dict:
    def look() -> dict | None:
        batch = admin.get(f"/v1/batches/{batch_id}").json()
        return batch if batch["status"] in SETTLED else None

    return wait_until(look, timeout_s, f"batch {batch_id} to settle", poll_s=0.25)


def batch_phase(admin: httpx.Client, *, requests: int, max_tokens: int) -> dict:
    start = time.perf_counter()
    batch_id = create_batch(admin, requests=requests, max_tokens=max_tokens)
    done = settled(admin, batch_id)
    wall_s = time.perf_counter() - start
    output = admin.get(f"/v1/files/{done['output_file_id']}/content").text.splitlines()
    tokens = sum(json.loads(x)["response"]["body"]["usage"]["completion_tokens"] for x in output)
    return {
        "status": done["status"],
        "request_counts": done["request_counts"],
        # Where the time went (the API's whole seconds): queueing the lines, then running.
        "queueing_lines_s": done["in_progress_at"] - done["created_at"],
        "running_s": done["completed_at"] - done["in_progress_at"],
        "wall_s": round(wall_s, 2),
        "completion_tokens": tokens,
        "tokens_per_s": round(tokens / wall_s, 1),
    }


def probe(platform: Platform, args: argparse.Namespace) -> dict:
    wall_s, samples, errors = asyncio.run(
        synchronous(platform, requests=args.probe, concurrency=4, max_tokens=args.max_tokens)
    )
    ttfts = [s.ttft_s * 1000 for s in samples]
    return {
        "median_ttft_ms": round(statistics.median(ttfts), 1),
        "p90_ttft_ms": round(statistics.quantiles(ttfts, n=10)[-1], 1),
        # In the order they finished: whether slow ones are the first (a batch's slots
        # changing hands) or spread over the probe.
        "ttft_ms_in_order": [round(t) for t in ttfts],
        "errors": errors,
        "wall_s": round(wall_s, 2),
    }


def probe_beside_batch(platform: Platform, admin: httpx.Client, args: argparse.Namespace) -> dict:
    batch_id = create_batch(admin, requests=args.requests, max_tokens=args.max_tokens)
    # Measured once the batch's lines run (some finished), not while they are queued.
    wait_until(
        lambda: admin.get(f"/v1/batches/{batch_id}").json()["request_counts"]["completed"] > 0,
        600,
        "the batch's first lines to finish",
        poll_s=0.2,
    )
    measured = probe(platform, args)
    batch = admin.get(f"/v1/batches/{batch_id}").json()
    measured["batch_status_after_probe"] = batch["status"]
    measured["batch_completed_after_probe"] = batch["request_counts"]["completed"]
    admin.post(f"/v1/batches/{batch_id}/cancel").raise_for_status()
    settled(admin, batch_id)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--probe", type=int, default=32, help="requests per TTFT probe")
    parser.add_argument(
        "--job-slots-beside-sync",
        type=int,
        default=None,
        help="EBB_JOB_SLOTS_BESIDE_SYNC for the platform (default: unset)",
    )
    args = parser.parse_args()

    env = {}
    if args.job_slots_beside_sync is not None:
        env["EBB_JOB_SLOTS_BESIDE_SYNC"] = str(args.job_slots_beside_sync)
    platform = start_ebb(temp_home("ebb-bench-batch-") / "ebb", env)
    result: dict = {"args": vars(args)}
    try:
        with platform.admin() as admin:
            asyncio.run(synchronous(platform, requests=8, concurrency=4, max_tokens=4))  # warm
            wall_s, samples, errors = asyncio.run(
                synchronous(
                    platform, requests=args.requests, concurrency=32, max_tokens=args.max_tokens
                )
            )
            tokens = sum(s.completion_tokens for s in samples)
            result["synchronous"] = {
                "wall_s": round(wall_s, 2),
                "completion_tokens": tokens,
                "tokens_per_s": round(tokens / wall_s, 1),
                "errors": errors,
            }
            print("synchronous, concurrency 32:", result["synchronous"], flush=True)
            result["batch"] = batch_phase(admin, requests=args.requests, max_tokens=args.max_tokens)
            print("batch:", result["batch"], flush=True)
            result["probe_alone_before"] = probe(platform, args)
            print("probe alone:", result["probe_alone_before"], flush=True)
            result["probe_beside_batch"] = probe_beside_batch(platform, admin, args)
            print("probe beside a batch:", result["probe_beside_batch"], flush=True)
            result["probe_alone_after"] = probe(platform, args)
            print("probe alone again:", result["probe_alone_after"], flush=True)
    finally:
        platform.stop()
    report(result)


def report(result: dict) -> None:
    ratio = result["batch"]["tokens_per_s"] / result["synchronous"]["tokens_per_s"]
    alone = statistics.mean(
        [
            result["probe_alone_before"]["median_ttft_ms"],
            result["probe_alone_after"]["median_ttft_ms"],
        ]
    )
    beside = result["probe_beside_batch"]["median_ttft_ms"]
    result["batch_vs_sync_tokens_per_s"] = round(ratio, 3)
    result["ttft_increase_pct"] = round(100 * (beside / alone - 1), 1)
    print(
        f"batch / synchronous tokens/s: {ratio:.3f} (target >= 1.0); synchronous median TTFT "
        f"{alone:.0f} ms alone, {beside:.0f} ms beside a batch: "
        f"{result['ttft_increase_pct']:+.1f} % (target <= +10 %)"
    )
    save_results("batch", result)


if __name__ == "__main__":
    main()
