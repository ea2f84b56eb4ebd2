"""An online latency model of one deployment's runners, fitted from the requests they
finished: TPOT = a + b * batch size, and TTFT = c + d * prompt tokens + queue wait. Pure.

Each line is an ordinary least-squares fit over the last `KEPT` samples (a window, so the
model follows a runner that changed, e.g. another machine). A line is not used with
fewer than `MIN_SAMPLES` samples or with no spread in x (all at one batch size: nothing
says how it grows); the caller then falls back to the measured p90 (`scaling_slo`).
A slope below zero (noise over a narrow range) is taken as flat: latency does not fall
as load grows.

`predict` turns a fit into what the deployment's runners would show at an arrival rate:
by Little's law each runner holds B = rate/n * D(B) requests, where a request holds its
slot for D(B) = prefill(prompt) + output tokens * TPOT(B); so
B = (rate/n)(P + O a) / (1 - (rate/n) O b). Past the runners' slots, the queue grows
without bound: the predicted TTFT is infinite (the rate exceeds what they can serve).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MIN_SAMPLES = 20
KEPT = 500
# Samples' finish times kept for the arrival rate, and prompt lengths for their p90.
RATE_WINDOW_S = 60.0
MIN_RATE_SPAN_S = 5.0


@dataclass(frozen=True)
class Line:
    intercept: float
    slope: float
    samples: int

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x


def fit_line(points: Sequence[tuple[float, float]], min_samples: int = MIN_SAMPLES) -> Line | None:
    """Least squares y = intercept + slope * x; None with fewer than `min_samples` points
    or with every x the same."""
    n = len(points)
    if n < max(min_samples, 2):
        return None
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx <= 1e-12 * max(1.0, mean_x * mean_x) * n:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    if slope < 0:
        return Line(mean_y, 0.0, n)
    return Line(mean_y - slope * mean_x, slope, n)


@dataclass(frozen=True)
class Sample:
    """One finished request, as its runner reported it (None: not reported)."""

    finished_s: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    queue_s: float | None = None  # enqueue to claim, part of `ttft_s`
    tpot_s: float | None = None
    batch_size: float | None = None  # mean requests in its runner's batch while it decoded


@dataclass(frozen=True)
class LatencyFit:
    """The model now: its lines (`tpot` None: too few samples or one batch size), the
    recent load it was fed."""

    tpot: Line | None  # seconds per output token, x = batch size
    prefill: Line  # seconds from claim to first token, x = prompt tokens
    tpot_mean_s: float  # over the kept samples (a request's length while `tpot` is None)
    rate_per_s: float  # requests finished per second over `RATE_WINDOW_S` (or less)
    prompt_p90_tokens: float
    prompt_mean_tokens: float
    output_mean_tokens: float


@dataclass(frozen=True)
class Prediction:
    runners: int
    batch: float  # requests each runner holds (inf: more than it can serve)
    tpot_s: float | None  # None: the TPOT line is not fitted (too few, or one batch size)
    ttft_s: float  # at the p90 prompt, with the queue wait (inf: the queue grows)

    def describe(self) -> str:
        if math.isinf(self.ttft_s):
            return f"{self.runners} runners: rate beyond their slots (queue grows)"
        tpot = "" if self.tpot_s is None else f", tpot {self.tpot_s:.3f}s"
        return f"{self.runners} runners: batch {self.batch:.1f}, ttft {self.ttft_s:.3f}s{tpot}"


class LatencyModel:
    """Fed finished requests (`observe`), read once per reconcile (`fit`)."""

    def __init__(self, kept: int = KEPT, min_samples: int = MIN_SAMPLES):
        self._min = min_samples
        self._tpot: deque[tuple[float, float]] = deque(maxlen=kept)
        self._prefill: deque[tuple[float, float]] = deque(maxlen=kept)
        self._recent: deque[Sample] = deque(maxlen=kept)

    def observe(self, samples: Iterable[Sample]) -> None:
        for s in samples:
            if s.tpot_s is not None and s.batch_size is not None:
                self._tpot.append((s.batch_size, s.tpot_s))
            if s.ttft_s is not None and s.prompt_tokens is not None and s.queue_s is not None:
                self._prefill.append((s.prompt_tokens, max(0.0, s.ttft_s - s.queue_s)))
            self._recent.append(s)

    def fit(self, now_s: float) -> LatencyFit | None:
        """None until the prefill line has enough samples (no TTFT, no request length to
        predict with); the rate is over the last `RATE_WINDOW_S`."""
        prefill = fit_line(list(self._prefill), self._min)
        if prefill is None:
            return None
        tpot = fit_line(list(self._tpot), self._min)
        tpots = [y for _, y in self._tpot]
        recent = [s for s in self._recent if s.finished_s >= now_s - RATE_WINDOW_S]
        # Over what the samples cover: since the first, when the model is younger than the
        # window or more than `KEPT` finished within it.
        oldest_s = min((s.finished_s for s in recent), default=now_s)
        span_s = min(RATE_WINDOW_S, max(MIN_RATE_SPAN_S, now_s - oldest_s))
        prompts = sorted(s.prompt_tokens for s in recent if s.prompt_tokens is not None)
        outputs = [s.completion_tokens for s in recent if s.completion_tokens is not None]
        return LatencyFit(
            tpot=tpot,
            prefill=prefill,
            tpot_mean_s=sum(tpots) / len(tpots) if tpots else 0.0,
            rate_per_s=len(recent) / span_s,
            prompt_p90_tokens=_p90(prompts),
            prompt_mean_tokens=sum(prompts) / len(prompts) if prompts else 0.0,
            output_mean_tokens=sum(outputs) / len(outputs) if outputs else 0.0,
        )


def predict(fit: LatencyFit, runners: int, slots: int, held: int = 0) -> Prediction:
    """What `runners` runners with `slots` batch slots each would show at the fit's
    arrival rate, or holding `held` requests between them now if that is more."""
    runners = max(runners, 1)
    a, b = (fit.tpot.intercept, fit.tpot.slope) if fit.tpot else (fit.tpot_mean_s, 0.0)
    prefill_s = fit.prefill.at(fit.prompt_mean_tokens)
    per_runner = fit.rate_per_s / runners
    grows = per_runner * fit.output_mean_tokens * b
    batch = math.inf
    if grows < 1:
        batch = per_runner * (prefill_s + fit.output_mean_tokens * a) / (1 - grows)
    batch = max(batch, held / runners)
    tpot_s = fit.tpot.at(min(batch, slots)) if fit.tpot else None
    ttft_s = math.inf if batch > slots else fit.prefill.at(fit.prompt_p90_tokens)
    return Prediction(runners, batch, tpot_s, ttft_s)


def _p90(ordered: Sequence[int]) -> float:
    if not ordered:
        return 0.0
    return float(ordered[min(len(ordered) - 1, max(0, math.ceil(0.9 * len(ordered)) - 1))])
