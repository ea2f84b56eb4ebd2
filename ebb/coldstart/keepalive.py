"""Keep-alive learned per deployment from its own idle times (Shahrad et al., "Serverless
in the Wild", ATC '20: the hybrid histogram policy's keep-alive half). Pure.

Two rules, both giving back only ready runners that hold nothing, never below the floor:
- the deployment's last runners: its idle periods (holding and queueing nothing, until
  the next request) are its own distribution; keep-alive = their `KEEP_PCT` percentile.
  Idle longer than that, the next request is unlikely soon: back to the floor (zero where
  `min_replicas` is 0). Never later than the fixed window (the runner's own idle
  timeout); with fewer than `MIN_PERIODS` periods, the fixed window stands.
- spare runners: one idle `SPARE_IDLE_S` goes while the others' slots, `SPARE_SHARE`
  full, would still have held the most requests held at once lately: its absence would
  have made nothing queue.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ebb.coldstart.scaling_inputs import Measured

KEEP_PCT = 99.0
MIN_PERIODS = 30
SPARE_IDLE_S = 10.0
SPARE_SHARE = 0.75
# Never shorter than this: a runner is not given back between two tokens of a burst.
FLOOR_S = 2.0


@dataclass(frozen=True)
class KeepAlive:
    window_s: float
    learned: bool
    why: str


def percentile(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(pct / 100 * len(ordered)) - 1))]


def learn_keep_alive(periods_s: Sequence[float], fixed_s: float) -> KeepAlive:
    if len(periods_s) < MIN_PERIODS:
        return KeepAlive(fixed_s, False, f"{len(periods_s)} idle periods: fixed {fixed_s:g}s")
    p = percentile(periods_s, KEEP_PCT)
    if p >= fixed_s:
        return KeepAlive(fixed_s, False, f"p{KEEP_PCT:g} idle {p:.1f}s: fixed {fixed_s:g}s")
    window_s = max(FLOOR_S, p)
    return KeepAlive(window_s, True, f"p{KEEP_PCT:g} of {len(periods_s)} idle periods")


def keep_alive_drains(
    measured: Measured,
    idle_ready: Sequence[str],
    *,
    ready: int,
    floor: int,
    max_concurrency: int,
    fixed_s: float,
) -> tuple[list[str], str]:
    """Which of `idle_ready` (ready runners holding nothing, least useful first) to give
    back, and why ("" and [] for none). Like the fixed window it replaces, it is not held
    by the reversal gap (which is the policies'): an idle runner is given back."""
    keep = learn_keep_alive(measured.idle_periods_s, fixed_s)
    if measured.idle_s > keep.window_s:
        last = list(idle_ready[: max(0, ready - floor)])
        why = f"idle {measured.idle_s:.0f}s > keep-alive {keep.window_s:.1f}s ({keep.why})"
        return last, why if last else ""
    given: list[str] = []
    for runner_id in idle_ready:
        left = ready - len(given) - 1
        if left < max(floor, 1) or measured.idle_for_s.get(runner_id, 0.0) < SPARE_IDLE_S:
            continue
        if left * max_concurrency * SPARE_SHARE < measured.peak_held:
            break
        given.append(runner_id)
    if not given:
        return [], ""
    return given, (
        f"spare: {len(given)} idle {SPARE_IDLE_S:g}s+ while the rest hold the recent "
        f"peak of {measured.peak_held} at {SPARE_SHARE:.0%}"
    )
