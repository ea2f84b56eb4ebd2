"""The hybrid histogram policy (Shahrad et al., "Serverless in the Wild", ATC '20), per
level of a deployment's need. Pure.

A deployment's need is the runners its held and queued requests fill
(`ceil(demand / max_concurrency)`). Level k is idle from when the need drops below k
until it next reaches k: for level 1 that is the deployment's own idle time (the gap
from its last request to its next), for level k the gap before concurrency next needs a
k-th runner. Each level has its own histogram of those gaps, and from it two windows:

- keep-alive: the `KEEP_PCT` (99th) percentile, `MARGIN` longer: a level idle past it
  is unlikely to be needed soon, so its runner is given back;
- pre-warm: the `PREWARM_PCT` (5th) percentile, `MARGIN` shorter. When even it is far
  (more than the cold start plus `RELEASE_MIN_S`), the runner is given back at once and
  started again the measured cold start before the pre-warm point, so that it is ready
  when the level is likely needed again; it is then kept until the keep-alive point.

Only gaps longer than the cold start are in the histogram: a level's need flickers
below it between two reconciles far more often than it is really idle (on the Azure
conversation trace 50-65 % of levels 5-8's gaps were under a second), and no runner can
be given back and be up again within such a gap, so it is not idle time the keep-alive
decides on; counted, the flickers pulled the p99 down to 26-47 s and runners went
before the next real need. (The paper's minute bins never see such gaps.)

The histogram is trusted only when it is representative: at least `MIN_PERIODS` gaps,
at most `OOB_MAX` of them beyond its range (`BINS` bins of `BIN_S`), and a coefficient
of variation of its bin counts of at least `CV_MIN` (a flat histogram predicts nothing;
Shahrad's test). Else the fixed window (the runner's own idle timeout) stands, measured
on the level's idle time: a level not needed for that long gives its runner back, even
if that runner held a request lately only because requests spread over the runners.
The bins are seconds, not the paper's minutes: LLM runners start in seconds here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ebb.coldstart.keepalive import FLOOR_S, percentile

KEEP_PCT = 99.0
PREWARM_PCT = 5.0
MARGIN = 0.10
MIN_PERIODS = 30
BIN_S = 1.0
BINS = 240
OOB_MAX = 0.5
CV_MIN = 2.0
# Giving a runner back and starting it again must save at least this much idle time.
RELEASE_MIN_S = 5.0


@dataclass(frozen=True)
class Windows:
    """One level's windows, in seconds of the level's idle time: its runner is up from
    `prewarm_s` (0: from the start of the gap, never given back first) to `keep_s`.
    `learned` False: the fixed window stands as `keep_s` (never pre-warmed)."""

    keep_s: float
    prewarm_s: float = 0.0
    learned: bool = False
    why: str = ""


def bin_cv(periods_s: Sequence[float]) -> float:
    """Coefficient of variation of the histogram's in-range bin counts."""
    counts = [0] * BINS
    for p in periods_s:
        b = int(p / BIN_S)
        if b < BINS:
            counts[b] += 1
    mean = sum(counts) / BINS
    if mean == 0:
        return 0.0
    var = sum((c - mean) ** 2 for c in counts) / BINS
    return math.sqrt(var) / mean


def hybrid_windows(periods_s: Sequence[float], fixed_s: float, cold_start_s: float) -> Windows:
    """A level's windows from its idle periods (`fixed_s`: the runner's own idle timeout,
    the fallback and the longest keep-alive; `cold_start_s`: how long a start takes)."""
    gaps = [p for p in periods_s if p > cold_start_s]
    n = len(gaps)
    if n < MIN_PERIODS:
        return Windows(
            fixed_s,
            why=f"{n} idle periods past the {cold_start_s:g}s cold start: fixed {fixed_s:g}s",
        )
    in_range = [p for p in gaps if p < BINS * BIN_S]
    oob = 1 - len(in_range) / n
    if oob > OOB_MAX:
        return Windows(fixed_s, why=f"{oob:.0%} of idle periods past {BINS * BIN_S:g}s: fixed")
    cv = bin_cv(in_range)
    if cv < CV_MIN:
        return Windows(fixed_s, why=f"histogram flat (CV {cv:.1f} < {CV_MIN:g}): fixed")
    keep_s = min(fixed_s, max(FLOOR_S, percentile(in_range, KEEP_PCT) * (1 + MARGIN)))
    head_s = percentile(in_range, PREWARM_PCT) * (1 - MARGIN)
    prewarm_s = head_s if head_s - cold_start_s > RELEASE_MIN_S else 0.0
    if prewarm_s >= keep_s:
        prewarm_s = 0.0
    why = f"p{KEEP_PCT:g} of {n} idle periods"
    if prewarm_s:
        why += f", p{PREWARM_PCT:g} {prewarm_s:.1f}s"
    return Windows(keep_s, prewarm_s, True, why)


def level_wanted(idle_s: float, windows: Windows, cold_start_s: float) -> bool:
    """Whether a level idle for `idle_s` should have its runner up now."""
    if not windows.learned:
        return idle_s < windows.keep_s
    start_s = max(0.0, windows.prewarm_s - cold_start_s) if windows.prewarm_s else 0.0
    return start_s <= idle_s < windows.keep_s
