"""What `bench.step_load` reports from a run: times from the load step to the scale-out
decision, to the new runner ready, and to the p90 TPOT back under its target. Pure."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

# A sliding window's p90 is judged only over at least this many finished requests.
MIN_WINDOW_REQUESTS = 5


@dataclass(frozen=True)
class Finished:
    """One request, client-measured (wall times)."""

    started_s: float
    finished_s: float
    ttft_s: float
    tpot_s: float


def window_p90(finished: list[Finished], at_s: float, window_s: float) -> float | None:
    """p90 TPOT of the requests that finished in (at_s - window_s, at_s]."""
    tpots = [f.tpot_s for f in finished if at_s - window_s < f.finished_s <= at_s]
    if len(tpots) < MIN_WINDOW_REQUESTS:
        return None
    return statistics.quantiles(tpots, n=10)[-1]


def scale_outs(log_lines: list[str]) -> list[dict[str, Any]]:
    """The controller's scale-out decisions (`Scaled`, direction +1) in the deployment's
    decision log lines, with their wall time."""
    found = []
    for line in log_lines:
        if not line.startswith("{"):
            continue
        try:
            decision = json.loads(line)
        except ValueError:
            continue
        for action in decision.get("actions", []):
            if action.get("action") == "Scaled" and action.get("direction") == 1:
                at = datetime.strptime(decision["ts"], "%Y-%m-%dT%H:%M:%S.%fZ")
                found.append(
                    {
                        "at_s": at.replace(tzinfo=UTC).timestamp(),
                        "desired": action.get("desired"),
                        "policy": action.get("policy"),
                        "reasons": action.get("reasons", []),
                    }
                )
    return found


def _after(t: float | None, origin: float) -> float | None:
    return None if t is None else round(t - origin, 2)


def _first_ready_above(changes: list[tuple[float, int]], count: int, since: float) -> float | None:
    return next((t for t, n in changes if t >= since and n > count), None)


def _ready_at(changes: list[tuple[float, int]], at_s: float) -> int:
    before = [n for t, n in changes if t <= at_s]
    return before[-1] if before else 0


def report(
    phases: dict[str, Any],
    ready_changes: list[tuple[float, int]],
    log_lines: list[str],
    window_s: float,
) -> dict[str, Any]:
    """The run's figures, each a time in seconds after the step (None: did not happen
    within the run), a timeline of the window's p90, and summary lines to print."""
    step, target = phases["step_at"], phases["tpot_target_s"]
    finished: list[Finished] = phases["finished"]
    after_step = sorted(f.finished_s for f in finished if f.finished_s > step)
    p90_at = {t: window_p90(finished, t, window_s) for t in after_step}
    broke = next((t for t in after_step if (p := p90_at[t]) is not None and p > target), None)
    outs = [s for s in scale_outs(log_lines) if s["at_s"] >= step]
    decided = outs[0]["at_s"] if outs else None
    before = _ready_at(ready_changes, step)
    ready = _first_ready_above(ready_changes, before, decided) if decided else None
    back = None
    if ready is not None:
        back = next(
            (t for t in after_step if t >= ready and (p := p90_at[t]) is not None and p <= target),
            None,
        )
    figures = {
        "tpot_target_s": target,
        "base_p90_tpot_s": phases["base_p90_tpot_s"],
        "window_s": window_s,
        "runners_before_step": before,
        "runners_at_end": _ready_at(ready_changes, phases["ended_at"]),
        "requests_after_step": len(after_step),
        "request_errors": phases.get("errors", 0),
        "p90_over_target_after_s": _after(broke, step),
        "scale_out_decided_after_s": _after(decided, step),
        "scale_out_reason": outs[0]["reasons"] if outs else None,
        "scale_outs": [{**s, "after_s": _after(s["at_s"], step)} for s in outs],
        "runner_ready_after_s": _after(ready, step),
        "p90_back_under_target_after_s": _after(back, step),
        "scale_outs_before_back": sum(1 for s in outs if back is not None and s["at_s"] <= back),
        "run_after_step_s": round(phases["ended_at"] - step, 1),
        "timeline": [
            [round(t - step, 2), None if p is None else round(p, 4), _ready_at(ready_changes, t)]
            for t, p in p90_at.items()
        ],
    }
    return figures | {"summary": summary(figures)}


def summary(f: dict[str, Any]) -> list[str]:
    def when(key: str) -> str:
        return "not within the run" if f[key] is None else f"{f[key]} s after the step"

    base = f["base_p90_tpot_s"]
    base_text = "none" if base is None else f"{base:.4f} s"
    return [
        f"target: p90 TPOT {f['tpot_target_s']} s (1x p90 {base_text}), window "
        f"{f['window_s']} s; runners {f['runners_before_step']} at the step, "
        f"{f['runners_at_end']} at the end",
        f"p90 over the target: {when('p90_over_target_after_s')}",
        f"scale-out decided: {when('scale_out_decided_after_s')} {f['scale_out_reason'] or ''}",
        f"new runner ready: {when('runner_ready_after_s')}",
        f"p90 back under the target: {when('p90_back_under_target_after_s')}"
        + (
            f" (after {f['scale_outs_before_back']} scale-out(s))"
            if f["p90_back_under_target_after_s"] is not None
            else f" (run {f['run_after_step_s']} s after the step)"
        ),
    ]
