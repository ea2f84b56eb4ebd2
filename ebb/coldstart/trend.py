"""A short-horizon trend predictor: Holt's linear smoothing of a deployment's demand
(requests held and queued, sampled by the tracker) forecasts it one cold start ahead;
when the forecast needs a runner more than it has, one more is pre-warmed now, so that
it is ready as the rate rises rather than one cold start after. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

ALPHA = 0.5  # level smoothing
BETA = 0.3  # slope smoothing
MIN_SAMPLES = 5


@dataclass(frozen=True)
class Forecast:
    demand: float  # requests held and queued expected at the horizon
    slope_per_s: float


def holt(samples: Sequence[tuple[float, float]], horizon_s: float) -> Forecast | None:
    """Holt's linear forecast of `samples` ((when, value), oldest first, roughly evenly
    spaced) `horizon_s` after the last; None with fewer than `MIN_SAMPLES`."""
    if len(samples) < MIN_SAMPLES:
        return None
    step_s = (samples[-1][0] - samples[0][0]) / (len(samples) - 1)
    if step_s <= 0:
        return None
    level, slope = samples[0][1], samples[1][1] - samples[0][1]
    for _, value in samples[1:]:
        previous = level
        level = ALPHA * value + (1 - ALPHA) * (level + slope)
        slope = BETA * (level - previous) + (1 - BETA) * slope
    slope_per_s = slope / step_s
    return Forecast(max(0.0, level + slope_per_s * horizon_s), slope_per_s)


def trend_extra(
    samples: Sequence[tuple[float, float]],
    *,
    serving: int,
    max_replicas: int,
    max_concurrency: int,
    cold_start_s: float,
) -> tuple[int, str]:
    """One more runner (1) when the rising demand, one cold start ahead, needs more than
    `serving` runners; else 0. With why."""
    if serving >= max_replicas:
        return 0, ""
    forecast = holt(samples, cold_start_s)
    if forecast is None or forecast.slope_per_s <= 0:
        return 0, ""
    per_runner = max(max_concurrency, 1)
    need = math.ceil(forecast.demand / per_runner)
    # Only ahead of full runners: with a runner's slots to spare now, the rise is
    # absorbed, and a runner started on a forecast alone mostly idles.
    if need <= serving or math.ceil(samples[-1][1] / per_runner) < serving:
        return 0, ""
    return 1, (
        f"trend: demand rising {forecast.slope_per_s:+.2f}/s, {forecast.demand:.0f} expected"
        f" in {cold_start_s:.0f}s needs {need} runners"
    )
