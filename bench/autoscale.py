"""Autoscaling against real arrival patterns: ebb's policy and the keep-alive windows
operators know, on the Azure LLM traces.

    .venv/bin/python -m bench.autoscale [--max-replicas N] [--concurrency 8]
        [--runner default|calibrated | --runner-file PATH] [--rows "slo ttft 2s,slo+model"]
        [--claim-balance-ms 200]

Each trace (bench/traces) is replayed on a simulated clock by ebb.coldstart.simulation:
the platform's real `Controller` (scale-up policy, tier choice, pre-warmed pool, backoff),
runners that drain by the runner's own idle decision, Retry-After from the frontdoor's
estimate. Every row uses the same trace and the same runner model (RunnerModel's
defaults: the default model's speeds and start times on this machine), the same
max replicas, batch size (target concurrency) and 10 s admission window. ONE table per
trace; each row is:

  ebb            the defaults: the hybrid keep-alive (below) with the 60 s idle window as
                 its fallback and cap, scale to zero, one pre-warmed stem, runners
                 beyond it forked from the fork server
  ebb no forks   the same without the fork server: runners beyond the stem start fresh
  ebb no pool    neither stems nor forks: every start is a fresh process
  ebb fixed 60s  the default before the hybrid keep-alive: the queue-only block
                 (`QUEUE_ONLY`), each runner given back after 60 s idle
  runpod 5s      RunPod serverless's default idle timeout (5 s)
  fixed 15s/30s  windows between those defaults: where the fixed-window curve runs
  modal 60s      Modal's default scaledown window (60 s)
  knative 60s    Knative's default stable window (60 s)
  baseten 900s   Baseten's default scale-down delay (900 s)
  Every row below keeps the fixed keep-alive (`keep_alive: fixed`) unless it says
  otherwise, so that each shows its own policy alone.
  slo ttft 2s    scaling.policy slo, p90 TTFT 2 s: out when the measured p90 breaks it,
                 in (draining the least useful runner) when one fewer would still meet it
  utilisation    scaling.policy utilisation: busy-slot share > 70 % for 5 min adds one,
                 < 25 % for 30 min drains one (design 3c's rule)
  learned k-a    scaling.keep_alive learned: runners idle past the p99 of the
                 deployment's own idle periods are given back (60 s while history is short),
                 spare runners sooner while the rest would hold the recent peak
  learned 300s   the same with the runners' own idle timeout at 300 s: the learned window
                 may exceed 60 s where the deployment's idle periods say so
  slo+learned    both
  hybrid         scaling.keep_alive hybrid: Shahrad et al.'s hybrid histogram per level of
                 need (level k: the gap before concurrency next needs a k-th runner):
                 keep-alive the p99 of the level's gaps longer than a cold start,
                 pre-warm at its p5 (released at once, started a cold start before)
                 when that is far; the fixed window, on the level's idle time, while a
                 level's histogram is short or not representative
  hybrid 300s    the same with the runners' own idle timeout at 300 s (the longest window)
  trend          scaling.trend: Holt's linear forecast of the demand one cold start ahead
                 pre-warms one more runner when full runners will not hold it
  hybrid+trend   both
  trend 30s/2s   the trend predictor with the runners' idle timeout at 30 s and 2 s: a
                 shorter window, its cold starts cut by pre-warming ahead of rises
  fixed 120s     a window past 60 s: the curve's other side
  slo+model      slo ttft 2s with the online latency model (`slo.predict`): out when the
                 model predicts a break at the current rate, in only when it predicts
                 one fewer runner meets the target
  always on      min = max replicas: the baseline the runner-seconds are a ratio of

With `--runner calibrated` every row runs on the runner model fitted on the real engine
(`simulation_runners.CALIBRATED`, from bench.latency_calibrate: TPOT grows with the batch),
with two more rows: `slo tpot` (p90 TPOT alone, measured: the runner model's TPOT at a
batch of 5, 0.12 s here) and `tpot+model` (the same with the online latency model).
`--runner-file PATH` does the same on a `bench.latency_calibrate` result file (a run on
a GPU, say): the runner model fitted there, with the engine start times that run
measured (`simulation_runners.from_calibration`; the output says which it used).
`--rows` keeps only the named rows (and always on, the baseline).

What the fixed-window rows model: each replica is given back after a fixed idle timeout
(the window), with ebb's scale-up, ebb's start tiers (one stem, forked starts) and ebb's
guard that a replica does not leave while requests are queued — so they differ from the
ebb fixed 60s row only in when capacity is given back. What they do not model: each platform's own
start path (Modal's memory snapshots, RunPod's FlashBoot, Baseten's and Knative's
image pulls), their scale-up rules, Knative's scaling on the concurrency averaged over
the window (it can remove replicas that are not idle, and has a 6 s panic window) and its
scale-to-zero grace period, Modal's per-container buffers and Baseten's
concurrency-target autoscaler. ebb's own default idle window is 60 s, so its fixed row
and the 60 s rows can coincide: what ebb adds there is in the start tiers (the no-forks
and no-pool rows show what they buy), and beyond them the hybrid keep-alive.

Columns: runner-seconds (of runners given to the deployment; x always on), the share
of requests that waited on a cold start (admitted by a runner that came up after they
arrived, or refused with only starting runners), requests refused at the admission
window, the p50 and p99 queue wait of the admitted, times at zero, the share of all
requests with a first token within 2 s (refused ones miss), the p90 time per output
token (each request's, at the batch it joined: flat on the default runner model),
reversals (starts within 10 s of a drain: capacity given back and taken again), policy
reversals (starts within 10 s of a drain the controller directed, not of a runner's own
idle drain), starts. `--claim-balance-ms 0` replays the runners claiming in turn (before
least-loaded claiming).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from msgspec.structs import replace as replace_struct

from ebb.coldstart.simulation import (
    RunnerModel,
    ScalingSettings,
    SimulationResult,
    load_azure_trace,
    simulate,
)
from ebb.coldstart.simulation_runners import CALIBRATED, from_calibration
from ebb.queue.scaling_spec import QUEUE_ONLY, ScalingSpec, SloTarget

REPO = Path(__file__).resolve().parents[1]
# Each trace with the max replicas that serve it with room at its peaks at these speeds.
TRACES = {
    "code": (REPO / "bench" / "traces" / "azllm2023_code.csv", 8),
    "conversation": (REPO / "bench" / "traces" / "azllm2023_conv.csv", 12),
}
# Keep-alive windows operators know (their documented defaults), in seconds.
FIXED_WINDOWS_S = {
    "runpod 5s": 5.0,
    "fixed 15s": 15.0,
    "fixed 30s": 30.0,
    "modal 60s": 60.0,
    "knative 60s": 60.0,
    "baseten 900s": 900.0,
    "fixed 120s": 120.0,
}


# The TTFT target the SLO row keeps and every row's attainment is measured against.
TTFT_TARGET_S = 2.0


def variants(ebb: ScalingSettings) -> dict[str, ScalingSettings]:
    rows = {
        "ebb": ebb,
        "ebb no forks": replace(ebb, fork_server=False),
        "ebb no pool": replace(ebb, prewarm=0, fork_server=False),
        "ebb fixed 60s": replace(ebb, scaling=QUEUE_ONLY),
    }
    rows |= {
        name: replace(ebb, idle_timeout_s=s, scaling=QUEUE_ONLY)
        for name, s in FIXED_WINDOWS_S.items()
    }
    rows |= policy_variants(ebb)
    rows["always on"] = replace(ebb, min_replicas=ebb.max_replicas)
    return rows


def policy_variants(ebb: ScalingSettings) -> dict[str, ScalingSettings]:
    """Issue 39's policies (`scaling` blocks) beside the queue-only default."""
    slo = ScalingSpec(policy="slo", slo=SloTarget(ttft_p90_s=TTFT_TARGET_S), keep_alive="fixed")
    return {
        "slo ttft 2s": replace(ebb, scaling=slo),
        "utilisation": replace(ebb, scaling=replace_struct(QUEUE_ONLY, policy="utilisation")),
        "learned k-a": replace(ebb, scaling=ScalingSpec(keep_alive="learned")),
        # The learned window may exceed 60 s up to the runner's own idle timeout.
        "learned 300s": replace(
            ebb, idle_timeout_s=300.0, scaling=ScalingSpec(keep_alive="learned")
        ),
        "slo+learned": replace(ebb, scaling=replace_struct(slo, keep_alive="learned")),
        "slo+model": replace(
            ebb,
            scaling=replace_struct(slo, slo=SloTarget(ttft_p90_s=TTFT_TARGET_S, predict=True)),
        ),
    } | hybrid_variants(ebb)


def hybrid_variants(ebb: ScalingSettings) -> dict[str, ScalingSettings]:
    """The hybrid histogram keep-alive and pre-warm, and the trend predictor."""
    hybrid = ScalingSpec(keep_alive="hybrid")
    trend = replace_struct(QUEUE_ONLY, trend=True)
    return {
        "hybrid": replace(ebb, scaling=hybrid),
        "hybrid 300s": replace(ebb, idle_timeout_s=300.0, scaling=hybrid),
        "trend": replace(ebb, scaling=trend),
        "hybrid+trend": replace(ebb, scaling=replace_struct(hybrid, trend=True)),
        "trend 30s": replace(ebb, idle_timeout_s=30.0, scaling=trend),
        "trend 2s": replace(ebb, idle_timeout_s=2.0, scaling=trend),
    }


# The TPOT target of a calibrated runner model's extra rows: its TPOT at this batch.
TPOT_TARGET_BATCH = 5


def tpot_target_s(model: RunnerModel) -> float:
    """The model's TPOT at `TPOT_TARGET_BATCH`, to two significant figures (0.12 s for
    `CALIBRATED`)."""
    return float(f"{model.tpot_s(TPOT_TARGET_BATCH):.2g}")


def tpot_variants(ebb: ScalingSettings, tpot_s: float) -> dict[str, ScalingSettings]:
    """The latency model's own case: a TPOT target, with and without the model."""
    rows = {}
    for name, predict in (("slo tpot", False), ("tpot+model", True)):
        target = SloTarget(tpot_p90_s=tpot_s, predict=predict)
        rows[name] = replace(ebb, scaling=ScalingSpec(policy="slo", slo=target, keep_alive="fixed"))
    return rows


def summary(result: SimulationResult, baseline: SimulationResult) -> dict[str, Any]:
    return {
        "runner_seconds": round(result.runner_seconds),
        "runner_seconds_ratio": round(result.runner_seconds / baseline.runner_seconds, 3),
        "cold_wait_pct": round(100 * result.cold_wait_fraction, 2),
        "refused": result.refused,
        "refused_pct": round(100 * result.refused_fraction, 2),
        "wait_p50_s": round(result.wait_percentile_s(50), 2),
        "wait_p99_s": round(result.wait_percentile_s(99), 2),
        "tpot_p90_ms": round(1000 * result.tpot_percentile_s(90)),
        "starts": {str(tier): n for tier, n in sorted(result.starts.items())},
        "zero_periods": result.zero_periods,
        "slo_pct": round(100 * result.slo_attainment(TTFT_TARGET_S), 2),
        "reversals": result.flaps,
        "policy_reversals": result.policy_reversals,
    }


HEADER = (
    f"  {'':<13}{'runner-s':>9} {'x on':>5} {'cold wait':>9} {'refused':>12}"
    f" {'p50 s':>6} {'p99 s':>6} {'at 0':>5} {'ttft<=2s':>8} {'tpot90':>6} {'rev':>4}"
    f" {'prev':>4}  starts"
)


def row_line(name: str, row: dict[str, Any]) -> str:
    starts = " ".join(f"{tier}={n}" for tier, n in row["starts"].items())
    refused = f"{row['refused']} ({row['refused_pct']:.2f}%)"
    return (
        f"  {name:<13}{row['runner_seconds']:>9} {row['runner_seconds_ratio']:>5.2f}"
        f" {row['cold_wait_pct']:>8.2f}% {refused:>12} {row['wait_p50_s']:>6.2f}"
        f" {row['wait_p99_s']:>6.2f} {row['zero_periods']:>5} {row['slo_pct']:>7.2f}%"
        f" {row['tpot_p90_ms']:>4}ms {row['reversals']:>4} {row['policy_reversals']:>4}  {starts}"
    )


def runner_model(runner: str, runner_file: Path | None) -> tuple[RunnerModel, str]:
    """The runner model the rows run on, and a line saying where it came from."""
    if runner_file is not None:
        calibration = json.loads(runner_file.read_text())
        model, starts = from_calibration(calibration)
        device = calibration.get("device", "an unnamed device")
        return model, f"{runner_file} (fitted on {device}; {starts})"
    if runner == "calibrated":
        return CALIBRATED, "CALIBRATED (bench.latency_calibrate on this 2-core CPU)"
    return RunnerModel(), "RunnerModel's defaults (the default model on a 2-core CPU)"


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--max-replicas", type=int, help="default: per trace (8, 12)")
    parser.add_argument("--concurrency", type=int, default=8, help="target concurrency")
    runner = parser.add_mutually_exclusive_group()
    runner.add_argument("--runner", choices=("default", "calibrated"), default="default")
    runner.add_argument(
        "--runner-file", type=Path, help="a bench.latency_calibrate result: its runner model"
    )
    parser.add_argument("--rows", help="comma-separated row names to run (default: all)")
    parser.add_argument(
        "--claim-balance-ms",
        type=int,
        default=ScalingSettings().claim_balance_ms,
        help="least-loaded claiming's wait (EBB_CLAIM_BALANCE_MS; 0: runners claim in turn)",
    )
    args = parser.parse_args(argv)
    model, source = runner_model(args.runner, args.runner_file)
    print(f"runner model: {source}")
    calibrated = args.runner == "calibrated" or args.runner_file is not None
    report: dict[str, dict[str, Any]] = {}
    for name, (path, max_replicas) in TRACES.items():
        ebb = ScalingSettings(
            max_replicas=args.max_replicas or max_replicas,
            target_concurrency=args.concurrency,
            claim_balance_ms=args.claim_balance_ms,
        )
        trace = load_azure_trace(path)
        rows_run = variants(ebb) | (tpot_variants(ebb, tpot_target_s(model)) if calibrated else {})
        if args.rows:
            keep = {*args.rows.split(","), "always on"}
            rows_run = {v: settings for v, settings in rows_run.items() if v in keep}
        results = {v: simulate(trace, settings, model) for v, settings in rows_run.items()}
        rows = {v: summary(r, results["always on"]) for v, r in results.items()}
        settings = {k: v for k, v in vars(ebb).items() if k != "scaling"}
        report[name] = {"settings": settings, "rows": rows}
        print(f"{name} trace: {len(trace)} requests over {trace[-1].arrival_s:.0f} s, {settings}")
        print(HEADER)
        for variant, row in rows.items():
            print(row_line(variant, row))
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"autoscale-{time.strftime('%Y%m%d-%H%M%S')}.json"
    payload = {"runner_model": vars(model), "runner_source": source, "traces": report}
    path.write_text(json.dumps(payload, indent=2))
    print(f"results: {path}")
    return path


if __name__ == "__main__":
    main()
