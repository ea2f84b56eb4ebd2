"""`keep_alive: hybrid` and `trend`: how many runners a deployment's levels of need want
now (`coldstart.histogram`), and the one more the trend predictor pre-warms
(`coldstart.trend`). Pure; `scaling.decide` asks it.

Levels up to the need are needed. Above it, each level up to the runners there are
(`serving`), and the one above them, asks its windows: past its keep-alive, or before
its pre-warm point, its runner goes (an idle ready one, least useful first, never below
the floor); at its pre-warm point, one starts. A level whose histogram is not trusted
keeps the fixed window, on the level's idle time (and the runner's own idle timeout
still gives back a runner idle that long).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ebb.coldstart.histogram import Windows, hybrid_windows, level_wanted
from ebb.coldstart.scaling_inputs import Measured
from ebb.coldstart.trend import trend_extra


@dataclass(frozen=True)
class HybridMove:
    start: int = 0  # runners to pre-warm now
    drain: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()


def hybrid_move(
    measured: Measured,
    idle_ready: Sequence[str],
    *,
    serving: int,
    floor: int,
    max_replicas: int,
    fixed_s: float,
    cold_start_s: float,
) -> HybridMove:
    """`idle_ready`: ready runners holding nothing, least useful first. Levels start at 1;
    `measured.level_idle_s[k - 1]` is 0 while level k is needed."""
    idle = measured.level_idle_s
    top = min(serving + 1, max_replicas, len(idle))
    unwanted: list[str] = []
    start, reasons = 0, []
    for k in range(top, 0, -1):
        if idle[k - 1] <= 0:
            break  # needed now, and so is every level below
        periods = measured.level_periods_s[k - 1] if k <= len(measured.level_periods_s) else ()
        windows = hybrid_windows(periods, fixed_s, cold_start_s)
        wanted = level_wanted(idle[k - 1], windows, cold_start_s)
        if k > serving:
            # Only a pre-warm point starts a runner: within a keep-alive with none, the
            # level's runner was given back by its own idle timeout, and stays so.
            if wanted and windows.prewarm_s and floor < k:
                start = 1
                reasons.append(
                    f"pre-warm: level {k} idle {idle[k - 1]:.0f}s, likely needed from"
                    f" {windows.prewarm_s:.0f}s ({windows.why}), cold start {cold_start_s:.0f}s"
                )
            continue
        if not wanted and k > floor:
            unwanted.append(f"level {k} idle {idle[k - 1]:.0f}s {_outside(windows)}")
    drain = tuple(idle_ready[: min(len(unwanted), len(idle_ready), max(0, serving - floor))])
    if drain:
        reasons.append("hybrid keep-alive: " + "; ".join(unwanted[: len(drain)]))
    return HybridMove(start, drain, tuple(reasons))


def _outside(windows: Windows) -> str:
    if windows.prewarm_s:
        return (
            f"outside {windows.prewarm_s:.0f}-{windows.keep_s:.0f}s ({windows.why}):"
            " given back until its pre-warm point"
        )
    return f"> keep-alive {windows.keep_s:.1f}s ({windows.why})"


def trend_move(
    measured: Measured,
    *,
    serving: int,
    max_replicas: int,
    max_concurrency: int,
    cold_start_s: float,
) -> tuple[int, str]:
    """(1 and why) to pre-warm one more runner ahead of a rising demand, else (0, "")."""
    return trend_extra(
        measured.demand,
        serving=serving,
        max_replicas=max_replicas,
        max_concurrency=max_concurrency,
        cold_start_s=cold_start_s,
    )
