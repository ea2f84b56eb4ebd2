"""Keep-alive learned per deployment from its own idle times (Shahrad et al., "Serverless
in the Wild", ATC '20: the hybrid histogram policy). Pure.

A runner's idle period ends when it is handed a request again; one given back first ended
unknown (inf). Keep-alive = the `KEEP_PCT` percentile of the periods: a runner idle that
long will most likely not be needed soon, so it is given back (never later than the fixed
window, the runner's own idle timeout). With fewer than `MIN_PERIODS` periods, or when
the percentile is unknown (too many given back first), the fixed window stands.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

KEEP_PCT = 95.0
MIN_PERIODS = 30
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
