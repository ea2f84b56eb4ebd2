"""Admission decisions: how long to tell a refused client to wait (`Retry-After`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Before any cold start was observed: a fresh runner on a small CPU machine.
DEFAULT_COLD_START_S = 15.0
# Tiers in the order a new runner gets them.
TIER_PREFERENCE = ("sleeping", "prewarmed", "forked", "fresh", "fresh_fetch")


@dataclass(frozen=True)
class StartingRunner:
    """A runner on its way to READY for the deployment: the tier its start goes through
    and how long ago that start began."""

    tier: str
    elapsed_s: float


def cold_start_estimate_s(
    cold_starts_ms: dict[str, dict[str, float]],
    *,
    stems_available: bool,
    sleepers_available: bool = False,
    forks_available: bool = True,
) -> float:
    """The measured moving-average cold start for the tier the next runner will come from."""
    available = {
        "sleeping": sleepers_available,
        "prewarmed": stems_available,
        "forked": forks_available,
    }
    unavailable = {tier for tier, ok in available.items() if not ok}
    for tier in TIER_PREFERENCE:
        total = cold_starts_ms.get(tier, {}).get("total")
        if tier not in unavailable and total:
            return total / 1000
    return DEFAULT_COLD_START_S


def tier_estimate_s(cold_starts_ms: dict[str, dict[str, float]], tier: str) -> float:
    total = cold_starts_ms.get(tier, {}).get("total")
    return total / 1000 if total else DEFAULT_COLD_START_S


def retry_after_s(
    *,
    ready_runners: int,
    cold_starts_ms: dict[str, dict[str, float]],
    stems_available: bool,
    sleepers_available: bool = False,
    forks_available: bool = True,
    starting: Sequence[StartingRunner] = (),
) -> int:
    """Seconds a refused client should wait before its retry can be admitted.

    With a runner up, capacity frees as requests finish: retry soon. With runners starting,
    when the first of them is expected to be ready (its tier's measured start, less the
    time it has been starting). With none, the retry itself starts one: that start's
    estimate.
    """
    if ready_runners > 0:
        return 1
    if starting:
        estimate = min(tier_estimate_s(cold_starts_ms, r.tier) - r.elapsed_s for r in starting)
    else:
        estimate = cold_start_estimate_s(
            cold_starts_ms,
            stems_available=stems_available,
            sleepers_available=sleepers_available,
            forks_available=forks_available,
        )
    return max(1, math.ceil(estimate))
