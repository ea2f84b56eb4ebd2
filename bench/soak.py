"""Soak: thousands of requests and jobs through `ebb up` (fake engine), Redis's memory
sampled throughout, to show it is flat once past the retention windows.

    .venv/bin/python -m bench.soak [--rounds 3] [--requests 1200] [--jobs 240]
                                   [--concurrency 12] [--retention-s 5]

Each round sends `requests` synchronous chat requests (streamed and plain) and `jobs`
async jobs with a webhook to a local receiver, then waits out the retention (results,
jobs, deliveries: EBB_RESULT_TTL_S, EBB_JOB_RETENTION_S, EBB_WEBHOOK_GIVE_UP_S). Redis's
`used_memory` and key count are sampled every second. The ledger's hour data (raw token
records, trimmed once their hour is closed and exported; the open hour's booked lines;
the billed-once ids, kept three days) is bounded by time that a run of minutes never
reaches: its share is measured apart (MEMORY USAGE) and reported on its own line.
Reported, as ratios against the same run's first settled round (the baseline):
used_memory without the ledger's hour data after each round, and whether it is flat
(within 10 %). Results go to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support import Platform, temp_home, wait_until  # noqa: E402
from support.webhook_receiver import Receiver  # noqa: E402

from bench.loadgen import save_results  # noqa: E402
from ebb.queue import keys  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
FLAT_WITHIN = 0.10


@dataclass
class Sample:
    t_s: float
    used_bytes: int
    # The ledger's per-hour and per-day structures, bounded by time rather than by
    # retention windows a soak can wait out: raw token records (until their hour is
    # closed, exported and past EBB_USAGE_RETENTION_S), the open hour's booked lines
    # (until it closes) and the billed-once request ids (three UTC days).
    billing_bytes: int
    keys: int
    usage_records: int

    @property
    def without_billing_bytes(self) -> int:
        return self.used_bytes - self.billing_bytes


class Sampler(threading.Thread):
    def __init__(self, client: redis.Redis, interval_s: float = 1.0):
        super().__init__(daemon=True)
        self.client = client
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self.stop = threading.Event()
        self._t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append(self.sample())
            self.stop.wait(self.interval_s)

    def sample(self) -> Sample:
        info = self.client.info("memory")
        billing = [keys.USAGE]
        for prefix in (keys.LEDGER_LINES_PREFIX, keys.LEDGER_SEEN_PREFIX):
            billing += [k.decode() for k in self.client.scan_iter(match=prefix + "*")]
        return Sample(
            t_s=time.monotonic() - self._t0,
            used_bytes=int(info["used_memory"]),
            billing_bytes=sum(int(self.client.memory_usage(k, samples=0) or 0) for k in billing),
            keys=int(self.client.dbsize()),
            usage_records=int(self.client.xlen(keys.USAGE)),
        )


async def _one(client: httpx.AsyncClient, i: int, job_every: int, webhook: str) -> str:
    model = "soak"
    if i % job_every == job_every - 1:
        body = {
            "model": model,
            "endpoint": "chat.completions",
            "body": {"messages": MESSAGES, "max_tokens": 8},
            "webhook": {"url": webhook},
        }
        response = await client.post("/v1/jobs", json=body)
        return "job" if response.status_code == 202 else f"job:{response.status_code}"
    body = {"model": model, "messages": MESSAGES, "max_tokens": 16, "stream": i % 2 == 0}
    if body["stream"]:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = [line async for line in response.aiter_lines() if line.startswith("data:")]
        ok = response.status_code == 200 and lines and lines[-1] == "data: [DONE]"
        return "stream" if ok else f"stream:{response.status_code}"
    response = await client.post("/v1/chat/completions", json=body)
    return "plain" if response.status_code == 200 else f"plain:{response.status_code}"


async def send_round(
    platform: Platform, total: int, job_every: int, concurrency: int, webhook: str
) -> dict:
    counts: dict[str, int] = {}
    queue = iter(range(total))
    headers = {"Authorization": f"Bearer {platform.admin_key}"}
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(
        base_url=platform.base_url, headers=headers, timeout=120, limits=limits
    ) as client:

        async def worker() -> None:
            for i in queue:
                kind = await _one(client, i, job_every, webhook)
                counts[kind] = counts.get(kind, 0) + 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return counts


def settle(client: redis.Redis, receiver: Receiver, jobs: int, retention_s: float) -> None:
    """Until every job's webhook arrived, then past every retention window."""
    wait_until(lambda: len(receiver.accepted()) >= jobs, 600, "every job's webhook", poll_s=0.5)
    per_work = (keys.REQUEST_PREFIX, keys.EVENTS_PREFIX, keys.JOB_PREFIX, keys.DELIVERY_PREFIX)

    def drained() -> bool:
        return not any(next(client.scan_iter(match=p + "*", count=1000), None) for p in per_work)

    wait_until(drained, 600, "per-request and per-job records to expire", poll_s=0.5)
    time.sleep(retention_s)  # a last window for anything slower to go


def main() -> None:
    args = _parse()
    os.environ["EBB_TEST_ENGINES"] = "1"
    receiver = Receiver().start()
    retention = str(args.retention_s)
    platform = Platform(
        home=temp_home("ebb-soak-"),
        redis_url=None,
        env_extra={
            "EBB_RESULT_TTL_S": retention,
            "EBB_JOB_RETENTION_S": retention,
            "EBB_WEBHOOK_GIVE_UP_S": "1",
            "EBB_WEBHOOK_ALLOWED_CIDRS": "127.0.0.0/8",
        },
    ).start()
    try:
        with platform.admin() as admin:
            admin.post(
                "/v1/deployments",
                json={"name": "soak", "source": "fake://soak?step_ms=1", "max_concurrency": 16},
            ).raise_for_status()
        client = platform.redis()
        sampler = Sampler(client)
        sampler.start()
        rounds = []
        jobs_so_far = 0
        per_round = args.requests + args.jobs
        job_every = max(1, round(per_round / max(1, args.jobs)))
        for n in range(args.rounds):
            started = time.monotonic()
            counts = asyncio.run(
                send_round(platform, per_round, job_every, args.concurrency, receiver.url)
            )
            load_s = time.monotonic() - started
            jobs_so_far += counts.get("job", 0)
            settle(client, receiver, jobs_so_far, args.retention_s)
            after = sampler.sample()
            rounds.append(
                {"round": n + 1, "load_s": round(load_s, 1), "sent": counts, "after": after}
            )
            print(
                f"round {n + 1}: {counts} in {load_s:.0f}s; settled: "
                f"{after.without_billing_bytes / 2**20:.2f} MiB without the ledger's hour data, "
                f"which is {after.billing_bytes / 2**20:.2f} MiB "
                f"({after.usage_records} raw token records), {after.keys} keys",
                flush=True,
            )
        sampler.stop.set()
        sampler.join()
        _report(sampler.samples, rounds)
        print(f"keys left: {_key_kinds(client)}")
        print(f"redis-server memory: {_redis_process_memory(platform)}")
    finally:
        platform.stop()
        receiver.stop()


def _redis_process_memory(platform: Platform) -> str:
    import psutil

    for child in psutil.Process(platform.proc.pid).children():
        if child.name() == "redis-server":
            info = child.memory_full_info()
            return f"RSS {info.rss / 2**20:.1f} MiB, PSS {info.pss / 2**20:.1f} MiB"
    return "not found"


def _key_kinds(client: redis.Redis) -> dict[str, int]:
    """Key names with their ids cut off (ebb:runner:ID -> ebb:runner:), counted."""
    kinds: dict[str, int] = {}
    for key in client.scan_iter(count=1000):
        name = key.decode()
        kind = name if name.count(":") < 2 else name.rsplit(":", 1)[0] + ":"
        kinds[kind] = kinds.get(kind, 0) + 1
    return dict(sorted(kinds.items()))


def _report(samples: list[Sample], rounds: list[dict]) -> None:
    print("\n  t_s  used_MiB  w/o_ledger_MiB  ledger_MiB   keys  usage_records")
    step = max(1, len(samples) // 40)
    for s in samples[::step]:
        print(
            f"{s.t_s:5.0f}  {s.used_bytes / 2**20:8.2f}  {s.without_billing_bytes / 2**20:14.2f}"
            f"  {s.billing_bytes / 2**20:10.2f}  {s.keys:5d}  {s.usage_records:13d}"
        )
    base = rounds[0]["after"]
    ratios = [r["after"].without_billing_bytes / base.without_billing_bytes for r in rounds]
    key_ratios = [r["after"].keys / base.keys for r in rounds]
    flat = all(abs(r - 1) <= FLAT_WITHIN for r in ratios)
    per_record = [r["after"].billing_bytes / max(1, r["after"].usage_records) for r in rounds]
    print(
        f"\nsettled used_memory without the ledger's hour data, ratio to round 1: "
        f"{[round(r, 3) for r in ratios]}; keys: {[round(r, 3) for r in key_ratios]}"
    )
    print(f"flat after the retention window (within {FLAT_WITHIN:.0%}): {flat}")
    print(
        f"ledger hour data: {[r['after'].usage_records for r in rounds]} requests, "
        f"~{per_record[-1]:.0f} bytes each until their hour closes (lines), is exported and "
        f"past EBB_USAGE_RETENTION_S (raw records), and three days (billed-once ids)"
    )
    peak = max(s.used_bytes for s in samples)
    print(f"peak used_memory {peak / 2**20:.2f} MiB; baseline {base.used_bytes / 2**20:.2f} MiB")
    save_results(
        "soak",
        {
            "rounds": [
                {**{k: v for k, v in r.items() if k != "after"}, "after": vars(r["after"])}
                for r in rounds
            ],
            "ratios_without_ledger_hour_data": ratios,
            "flat": flat,
            "samples": [vars(s) for s in samples],
        },
    )


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1200)
    parser.add_argument("--jobs", type=int, default=240)
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--retention-s", type=int, default=5)
    return parser.parse_args()


if __name__ == "__main__":
    main()
