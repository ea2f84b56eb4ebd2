"""What the scaling policies measure of one deployment, as the world snapshot carries it
(`Demand.measured`). `scaling_tracker.ScalingTracker` fills it from the platform's
records; a test builds one by hand. Times are wall-clock seconds (`World.wall_s`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ebb.coldstart.latency_model import LatencyFit


@dataclass(frozen=True)
class Measured:
    ttft_p90_s: float | None = None  # over the SLO window; None: nothing finished in it
    tpot_p90_s: float | None = None
    # (when, busy share 0..1 of its runners' slots), oldest first, over the longest window
    # the utilisation rule looks at.
    utilisation: tuple[tuple[float, float], ...] = ()
    # How long each period in which the deployment held and queued nothing lasted before
    # its next request, oldest first (its own idle-time distribution).
    idle_periods_s: tuple[float, ...] = ()
    # How long it has held and queued nothing now (0: busy).
    idle_s: float = 0.0
    # The most requests its runners held at once lately (`scaling_tracker.PEAK_WINDOW_S`).
    peak_held: int = 0
    # Per ready runner: requests it holds, and how long it has held none (0: busy).
    held: Mapping[str, int] = field(default_factory=dict)
    idle_for_s: Mapping[str, float] = field(default_factory=dict)
    # Per level of need k (index k - 1; the need is the runners its held and queued
    # requests fill): its idle periods (need below k until it next reached k), oldest
    # first, and how long it has been below k now (0: needed). `coldstart.histogram`.
    level_periods_s: tuple[tuple[float, ...], ...] = ()
    level_idle_s: tuple[float, ...] = ()
    # (when, requests held and queued), oldest first, over `scaling_tracker.TREND_WINDOW_S`.
    demand: tuple[tuple[float, float], ...] = ()
    # Each start tier's measured cold start (`Tier` value -> seconds): when a pre-warm
    # must begin for its runner to be ready in time.
    cold_starts_s: Mapping[str, float] = field(default_factory=dict)
    # The controller's last scale-out and scale-in of it (for the reversal gap).
    last_out_s: float = -math.inf
    last_in_s: float = -math.inf
    # The online latency model (`scaling.slo.predict`); None: off, or too few samples.
    latency_fit: LatencyFit | None = None
