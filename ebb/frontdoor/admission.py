"""Admission decisions: how long to tell a refused client to wait (`Retry-After`)."""

from __future__ import annotations

import math

# Before any cold start was observed: a fresh runner on a small CPU machine.
DEFAULT_COLD_START_S = 15.0
# Tiers in the order a new runner gets them.
TIER_PREFERENCE = ("sleeping", "prewarmed", "fresh", "fresh_fetch")


def cold_start_estimate_s(
    cold_starts_ms: dict[str, dict[str, float]],
    *,
    stems_available: bool,
    sleepers_available: bool = False,
) -> float:
    """The measured moving-average cold start for the tier the next runner will come from."""
    unavailable = {
        tier
        for tier, available in (("sleeping", sleepers_available), ("prewarmed", stems_available))
        if not available
    }
    for tier in TIER_PREFERENCE:
        total = cold_starts_ms.get(tier, {}).get("total")
        if tier not in unavailable and total:
            return total / 1000
    return DEFAULT_COLD_START_S


def retry_after_s(
    *,
    ready_runners: int,
    cold_starts_ms: dict[str, dict[str, float]],
    stems_available: bool,
    sleepers_available: bool = False,
    waited_s: float = 0.0,
) -> int:
    """Seconds a refused client should wait before its retry can be admitted.

    With a runner up, capacity frees as requests finish: retry soon. With none, a runner
    has been starting since this request was queued `waited_s` ago: retry when it is
    expected to be ready.
    """
    if ready_runners > 0:
        return 1
    estimate = cold_start_estimate_s(
        cold_starts_ms, stems_available=stems_available, sleepers_available=sleepers_available
    )
    return max(1, math.ceil(estimate - waited_s))
