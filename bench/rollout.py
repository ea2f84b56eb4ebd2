"""Rollouts under load: time to first token while traffic moves between versions, against
the steady state of the same run, and failed requests (target 0).

    .venv/bin/python -m bench.rollout [--workers 8] [--steady-s 20] [--step-s 5]

`ebb up` on the fake engine; steady load from a few threads (half streaming, each request
with its own route key). Phases, one after another on the same deployment:
  steady     version 1 alone, --steady-s seconds (the baseline);
  immediate  version 2 deployed and rolled out at once, until version 1 drained;
  canary     version 3 as a canary 10 % -> 50 % -> 100 %, promoted every --step-s.
Each phase reports its requests, failures, and p50/p99 TTFT of the streams; the ratio is
each switch's p99 over the steady one.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from bench.loadgen import save_results
from bench.serving import REPO

sys.path.insert(0, str(REPO / "tests"))

from support import Platform, deploy, temp_home, wait_until  # noqa: E402
from support.steady_load import Outcome, SteadyLoad  # noqa: E402

SOURCE = "fake://m?step_ms=5&prefill_ms=5"


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(outcomes: list[Outcome]) -> dict:
    ttfts = [o.ttft_s * 1000 for o in outcomes if o.ttft_s is not None]
    return {
        "requests": len(outcomes),
        "failed": sum(not o.ok for o in outcomes),
        "versions": _count(outcomes),
        "ttft_p50_ms": _round(_p(ttfts, 0.5)),
        "ttft_p99_ms": _round(_p(ttfts, 0.99)),
    }


def _round(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 1)


def _count(outcomes: list[Outcome]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.version] = counts.get(o.version, 0) + 1
    return counts


def new_version(admin, name: str, source: str) -> int:
    r = admin.post("/v1/deployments", json={"name": name, "source": source})
    r.raise_for_status()
    return r.json()["deployed_version"]


def versions(admin, name: str) -> dict:
    return admin.get(f"/v1/deployments/{name}/versions").json()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--steady-s", type=float, default=20.0)
    parser.add_argument("--step-s", type=float, default=5.0)
    args = parser.parse_args()
    os.environ["EBB_TEST_ENGINES"] = "1"
    platform = Platform(home=temp_home("ebb-bench-rollout-"), redis_url=None).start()
    name = "roll"
    phases: dict[str, dict] = {}
    try:
        with platform.admin() as admin:
            deploy(admin, name, source=SOURCE, idle_timeout_s=600, max_concurrency=64)
            with SteadyLoad(
                platform.base_url, platform.admin_key, name, workers=args.workers
            ) as load:
                wait_until(lambda: len(load.snapshot()) >= 20, 120, "version 1 serving")
                began = time.monotonic()
                time.sleep(args.steady_s)  # the baseline's duration, not a synchronisation
                phases["steady"] = summary(load.since(began))

                began = time.monotonic()
                v2 = new_version(admin, name, SOURCE + "&v=2")
                admin.post(f"/v1/deployments/{name}/rollout", json={}).raise_for_status()
                wait_until(
                    lambda: versions(admin, name)["data"][0]["replicas"] == 0,
                    120,
                    "version 1 to drain",
                )
                ended = time.monotonic()
                phases["immediate"] = summary(
                    [o for o in load.since(began) if o.started_s <= ended]
                )
                phases["immediate"]["switch_s"] = round(ended - began, 2)

                began = time.monotonic()
                v3 = new_version(admin, name, SOURCE + "&v=3")
                body = {"version": v3, "strategy": "canary", "canary_pct": 10}
                admin.post(f"/v1/deployments/{name}/rollout", json=body).raise_for_status()
                wait_until(
                    lambda: versions(admin, name)["traffic"].get(str(v3)) == 10, 120, "canary"
                )
                for _ in range(2):
                    time.sleep(args.step_s)  # each step's dwell time, as an operator would
                    promote = admin.post(f"/v1/deployments/{name}/rollout/promote")
                    promote.raise_for_status()
                wait_until(
                    lambda: versions(admin, name)["data"][v2 - 1]["replicas"] == 0,
                    120,
                    "version 2 to drain",
                )
                ended = time.monotonic()
                phases["canary"] = summary([o for o in load.since(began) if o.started_s <= ended])
                phases["canary"]["switch_s"] = round(ended - began, 2)
                failed_total = len(load.failures())
    finally:
        platform.stop()
    steady_p99 = phases["steady"]["ttft_p99_ms"] or 0
    for phase in ("immediate", "canary"):
        p99 = phases[phase]["ttft_p99_ms"]
        phases[phase]["p99_ttft_vs_steady"] = (
            round(p99 / steady_p99, 2) if p99 and steady_p99 else None
        )
    payload = {"workers": args.workers, "phases": phases, "failed_total": failed_total}
    for phase, figures in phases.items():
        print(f"{phase:10s} {figures}")
    print(f"failed requests in the whole run: {failed_total} (target 0)")
    save_results("rollout", payload)


if __name__ == "__main__":
    main()
