"""Where the GPU-seconds went: a mixed workload on the fake engine, and the check that the
split reconciles, serving + loading + idle + asleep + wasted = metered, for every runner
and in all (same run; exact integer GPU-milliseconds, not a wall-clock threshold).

    .venv/bin/python -m bench.gpu_seconds [--requests 40]

The workload, on one platform:
  busy    cold starts from zero (load_s=1), `--requests` concurrent requests, then idle
          past its timeout, asleep (sleep mode), deleted (the sleeper exits);
  refused a cold start whose request gave up (503) while it loaded: all wasted;
  kept    a min_replicas runner that serves nothing, deleted: loading and idle;
  victim  a runner SIGKILLed mid-stream: its time since its last segment is wasted, and
          its stream goes on on another runner.
It prints each runner's split, the usage report's `gpu_costs` rows and the reconcile
verdict; it exits 1 if any sum differs from what was metered.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support import Platform, temp_home, wait_until  # noqa: E402

from ebb.billing.entries import gpu_uses  # noqa: E402
from ebb.billing.gpu_split import USES, use_metric  # noqa: E402
from ebb.queue import keys  # noqa: E402
from ebb.queue.metering import GpuSegment, decode_gpu_entry  # noqa: E402


def runners(admin, name: str) -> list[dict]:
    return admin.get(f"/v1/deployments/{name}").json()["runners"]


def one_runner_in(admin, name: str, state: str) -> dict:
    return wait_until(
        lambda: (rs := runners(admin, name)) and rs[0]["state"] == state and rs[0],
        120,
        f"{name}'s runner {state}",
    )


def run_busy(admin, requests: int) -> None:
    admin.post(
        "/v1/deployments",
        json={
            "name": "busy",
            "source": "fake://busy?load_s=1&step_ms=5&sleep=1",
            "idle_timeout_s": 2,
            "max_concurrency": 64,
        },
    )
    body = {"model": "busy", "prompt": "Hi", "max_tokens": 64}
    with ThreadPoolExecutor(16) as pool:
        codes = list(
            pool.map(
                lambda _: admin.post("/v1/completions", json=body).status_code, range(requests)
            )
        )
    print(f"busy: {codes.count(200)}/{requests} answered")
    one_runner_in(admin, "busy", "sleeping")


def run_refused(admin) -> None:
    """A cold start whose request gave up (503) while it loaded: it serves nothing."""
    admin.post(
        "/v1/deployments",
        json={
            "name": "refused",
            "source": "fake://refused?load_s=3",
            "idle_timeout_s": 1,
            "admission_timeout_s": 1,
        },
    )
    body = {"model": "refused", "prompt": "Hi", "max_tokens": 4}
    print("refused:", admin.post("/v1/completions", json=body).status_code)


def run_kept(admin) -> None:
    """A min_replicas runner that serves nothing: capacity kept on purpose (idle)."""
    admin.post(
        "/v1/deployments",
        json={"name": "kept", "source": "fake://kept?load_s=1", "min_replicas": 1},
    )
    one_runner_in(admin, "kept", "ready")


def run_victim(admin) -> None:
    admin.post(
        "/v1/deployments",
        json={"name": "victim", "source": "fake://victim?step_ms=20", "idle_timeout_s": 1},
    )
    started = threading.Event()

    def stream() -> None:
        body = {"model": "victim", "prompt": "Hi", "max_tokens": 200, "stream": True}
        with admin.stream("POST", "/v1/completions", json=body) as reply:
            for _ in reply.iter_lines():
                started.set()

    client = threading.Thread(target=stream, daemon=True)
    client.start()
    wait_until(started.is_set, 120, "the victim's stream")
    os.kill(runners(admin, "victim")[0]["pid"], signal.SIGKILL)
    client.join(120)


def segments(r: redis.Redis) -> dict[str, list[GpuSegment]]:
    by_runner: dict[str, list[GpuSegment]] = {}
    for _, fields in r.xrange(keys.GPU_USAGE):
        entry = decode_gpu_entry(fields)
        if isinstance(entry, GpuSegment):
            by_runner.setdefault(entry.meter.runner_id, []).append(entry)
    return by_runner


def split_reconciles(r: redis.Redis) -> bool:
    """Print every runner's split and whether serving + loading + idle + asleep + wasted =
    metered, for each and in all; `bench/priority` (or any bench) can call it on its
    platform's Redis once every runner's metering has closed."""
    ok = True
    total_metered, total = 0, dict.fromkeys(USES, 0)
    print(f"{'runner':<22}{'deployment':<12}{'metered ms':>11}" + "".join(f"{u:>10}" for u in USES))
    for runner_id, pieces in sorted(segments(r).items()):
        metered = sum(p.duration_ms * p.meter.gpu_count for p in pieces)
        split = dict.fromkeys(USES, 0)
        for p in pieces:
            parts = gpu_uses(p.duration_ms * p.meter.gpu_count, p.uses_ms)
            for u in USES:
                split[u] += parts[use_metric(u)]
        ok &= sum(split.values()) == metered
        total_metered += metered
        for u in USES:
            total[u] += split[u]
        print(
            f"{runner_id:<22}{pieces[-1].meter.deployment:<12}{metered:>11}"
            + "".join(f"{split[u]:>10}" for u in USES)
        )
    print(f"{'all':<34}{total_metered:>11}" + "".join(f"{total[u]:>10}" for u in USES))
    print(
        f"serving + loading + idle + asleep + wasted = {sum(total.values())} "
        f"{'==' if sum(total.values()) == total_metered else '!='} metered {total_metered}"
    )
    return ok and sum(total.values()) == total_metered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    platform = Platform(
        home=temp_home("ebb-bench-gpu-seconds-"),
        redis_url=None,
        env_extra={"EBB_TEST_ENGINES": "1", "EBB_GPU_METER_INTERVAL_S": "2"},
    ).start()
    try:
        with platform.admin() as admin:
            run_busy(admin, args.requests)
            run_refused(admin)
            run_kept(admin)
            run_victim(admin)
            admin.delete("/v1/deployments/busy")
            admin.delete("/v1/deployments/kept")
            r = platform.redis()
            wait_until(
                lambda: all(
                    r.hget(keys.runner(rid), "meter_closed") == b"1" for rid in segments(r)
                ),
                120,
                "every runner's metering closed",
            )
            ok = split_reconciles(r)
            usage = admin.get("/v1/usage").json()
            for row in usage["gpu_costs"]:
                print(
                    json.dumps(
                        {
                            k: row[k]
                            for k in (
                                "tenant",
                                "deployment",
                                "gpu_ms",
                                "gpu_ms_by_use",
                                "tokens_per_gpu_second",
                            )
                        }
                    )
                )
            reconciled = admin.get("/v1/usage/reconcile").json()
            print("reconcile:", "ok" if reconciled["ok"] else reconciled["drift"])
            ok &= reconciled["ok"]
    finally:
        platform.stop()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
