"""Admission decisions: how long to tell a refused client to wait (`Retry-After`)."""

from __future__ import annotations

import math

# Before any cold start was observed: a fresh runner on a small CPU machine.
DEFAULT_COLD_START_S = 15.0
# Tiers in the order a new runner gets them.
TIER_PREFERENCE = ("prewarmed", "fresh", "fresh_fetch")


def cold_start_estimate_s(
    cold_starts_ms: dict[str, dict[str, float]], stems_available: bool
) -> float:
    """The measured moving-average cold start for the tier the next runner will come from."""
    tiers = TIER_PREFERENCE if stems_available else TIER_PREFERENCE[1:]
    for tier in tiers:
        total = cold_starts_ms.get(tier, {}).get("total")
        if total:
            return total / 1000
    return DEFAULT_COLD_START_S


def retry_after_s(
    *,
    ready_runners: int,
    cold_starts_ms: dict[str, dict[str, float]],
    stems_available: bool,
    waited_s: float = 0.0,
) -> int:
    """Seconds a refused client should wait before its retry can be admitted.

    With a runner up, capacity frees as requests finish: retry soon. With none, a runner
    has been starting since this request was queued `waited_s` ago: retry when it is
    expected to be ready.
    """
    if ready_runners > 0:
        return 1
    remaining = cold_start_estimate_s(cold_starts_ms, stems_available) - waited_s
    return max(1, math.ceil(remaining))
