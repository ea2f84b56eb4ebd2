"""Autoscaling against real arrival patterns: the Azure LLM traces through ebb's policy.

    .venv/bin/python -m bench.autoscale [--max-replicas N] [--concurrency 8]

Each trace (bench/traces) is replayed on a simulated clock (ebb.coldstart.simulation) with
the platform's own policy, idle drain, pre-warmed pool and Retry-After, and the runner
speeds and start times measured on this machine (RunnerModel's defaults). Per trace:
  ebb         scale to zero, one pre-warmed stem, runners beyond it forked (the defaults)
  no forks    the same without the fork server: runners beyond the stem start fresh
  no pool     neither stems nor forks: every start is a fresh process
  always on   min = max replicas: the baseline the runner-seconds are a ratio of
Printed: requests refused at the admission window, queue wait percentiles of the
admitted, starts by tier, times the deployment fell to zero, and runner-seconds.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from ebb.coldstart.simulation import (
    RunnerModel,
    ScalingSettings,
    SimulationResult,
    load_azure_trace,
    simulate,
)

REPO = Path(__file__).resolve().parents[1]
# Each trace with the max replicas that serve it with room at its peaks at these speeds.
TRACES = {
    "code": (REPO / "bench" / "traces" / "azllm2023_code.csv", 8),
    "conversation": (REPO / "bench" / "traces" / "azllm2023_conv.csv", 12),
}


def summary(result: SimulationResult, baseline: SimulationResult) -> dict:
    return {
        "refused_pct": round(100 * result.refused_fraction, 2),
        "refused_while_starting": result.refused_while_starting,
        "wait_p50_s": round(result.wait_percentile_s(50), 2),
        "wait_p99_s": round(result.wait_percentile_s(99), 2),
        "starts": dict(result.starts),
        "zero_periods": result.zero_periods,
        "runner_seconds": round(result.runner_seconds),
        "runner_seconds_ratio": round(result.runner_seconds / baseline.runner_seconds, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-replicas", type=int, help="default: per trace (8, 12)")
    parser.add_argument("--concurrency", type=int, default=8, help="target concurrency")
    parser.add_argument("--idle-timeout", type=float, default=60.0)
    args = parser.parse_args()
    model = RunnerModel()
    report: dict[str, dict] = {}
    for name, (path, max_replicas) in TRACES.items():
        ebb = ScalingSettings(
            max_replicas=args.max_replicas or max_replicas,
            target_concurrency=args.concurrency,
            idle_timeout_s=args.idle_timeout,
        )
        variants = {
            "ebb": ebb,
            "no forks": replace(ebb, fork_server=False),
            "no pool": replace(ebb, prewarm=0, fork_server=False),
            "always on": replace(ebb, min_replicas=ebb.max_replicas),
        }
        trace = load_azure_trace(path)
        results = {v: simulate(trace, settings, model) for v, settings in variants.items()}
        report[name] = {v: summary(r, results["always on"]) for v, r in results.items()}
        report[name]["settings"] = vars(ebb)
        print(f"{name} trace: {len(trace)} requests over {trace[-1].arrival_s:.0f} s, {ebb}")
        for variant in variants:
            row = report[name][variant]
            print(
                f"  {variant:>9}: refused {row['refused_pct']:5.2f}%"
                f" ({row['refused_while_starting']} waiting on a start)"
                f"  wait p50 {row['wait_p50_s']:.2f} s p99 {row['wait_p99_s']:.2f} s"
                f"  starts {row['starts']}  at zero {row['zero_periods']}x"
                f"  runner-s {row['runner_seconds']} (x{row['runner_seconds_ratio']:.2f})"
            )
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"autoscale-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"runner_model": vars(model), "traces": report}, indent=2))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
