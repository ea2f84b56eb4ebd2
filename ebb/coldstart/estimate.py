"""How long a refused client should wait (`Retry-After`): pure functions of the measured
cold starts and of the deployment's runners.

The frontdoor calls `retry_after_for` with what it read from Redis; which runner counts as
starting, from which tier and since when, is decided here, next to the tiers themselves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ebb.launching.tiers import TIER_ORDER, Tier
from ebb.queue.schema import RunnerRecord, RunnerState

# Before any cold start was observed: a fresh runner on a small CPU machine.
DEFAULT_COLD_START_S = 15.0

# {tier: {phase: moving-average ms}}, as `PlatformState.cold_start_ms` returns it.
ColdStarts = dict[str, dict[str, float]]


@dataclass(frozen=True)
class StartingRunner:
    """A runner on its way to READY for the deployment: the tier its start goes through
    and how long ago that start began."""

    tier: Tier
    elapsed_s: float


def cold_start_estimate_s(
    cold_starts_ms: ColdStarts,
    *,
    stems_available: bool,
    sleepers_available: bool = False,
    forks_available: bool = True,
) -> float:
    """The measured moving-average cold start for the tier the next runner will come from."""
    unavailable = {
        tier
        for tier, ok in (
            (Tier.SLEEPING, sleepers_available),
            (Tier.PREWARMED, stems_available),
            (Tier.FORKED, forks_available),
        )
        if not ok
    }
    for tier in TIER_ORDER:
        total = cold_starts_ms.get(tier, {}).get("total")
        if tier not in unavailable and total:
            return total / 1000
    return DEFAULT_COLD_START_S


def tier_estimate_s(cold_starts_ms: ColdStarts, tier: Tier) -> float:
    total = cold_starts_ms.get(tier, {}).get("total")
    return total / 1000 if total else DEFAULT_COLD_START_S


def retry_after_s(
    *,
    ready_runners: int,
    cold_starts_ms: ColdStarts,
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


def starting_runner(runner: RunnerRecord, now_ms: float) -> StartingRunner:
    """The start a runner record is making for its deployment: a sleeper being woken
    starts through the sleeping tier, from its wake-up; a stem from its assignment."""
    tier = Tier.SLEEPING if runner.state is RunnerState.SLEEPING else Tier(runner.tier)
    began_ms = runner.assigned_ms or runner.launched_ms
    return StartingRunner(tier, (now_ms - began_ms) / 1000)


def retry_after_for(
    deployment: str,
    runners: Sequence[RunnerRecord],
    cold_starts_ms: ColdStarts,
    *,
    fork_server_ready: bool,
    now_ms: float,
) -> int:
    """`retry_after_s` for a deployment, from every live runner record of the platform
    (the pool's stems belong to no deployment and count for all)."""
    live = [r for r in runners if r.state.is_live]
    mine = [r for r in live if r.deployment == deployment]
    return retry_after_s(
        ready_runners=sum(r.state is RunnerState.READY for r in mine),
        cold_starts_ms=cold_starts_ms,
        stems_available=any(r.deployment == "" and r.state is RunnerState.PREWARMED for r in live),
        sleepers_available=any(r.state is RunnerState.SLEEPING for r in mine),
        forks_available=fork_server_ready,
        starting=[starting_runner(r, now_ms) for r in mine if r.is_starting],
    )
