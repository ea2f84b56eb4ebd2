"""What the scaling policies measure of one deployment, as the world snapshot carries it
(`Demand.measured`). `scaling_tracker.ScalingTracker` fills it from the platform's
records; a test builds one by hand. Times are wall-clock seconds (`World.wall_s`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Measured:
    ttft_p90_s: float | None = None  # over the SLO window; None: nothing finished in it
    tpot_p90_s: float | None = None
    # (when, busy share 0..1 of its runners' slots), oldest first, over the longest window
    # the utilisation rule looks at.
    utilisation: tuple[tuple[float, float], ...] = ()
    # How long each of its runners' idle periods lasted before the next request (inf: it
    # was given back first, so the period's end is unknown), oldest first.
    idle_periods_s: tuple[float, ...] = ()
    # Per ready runner: requests it holds, and how long it has held none (0: busy).
    held: Mapping[str, int] = field(default_factory=dict)
    idle_for_s: Mapping[str, float] = field(default_factory=dict)
    # The controller's last scale-out and scale-in of it (for the reversal gap).
    last_out_s: float = -math.inf
    last_in_s: float = -math.inf
