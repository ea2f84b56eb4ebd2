"""The latency target judged by the online latency model (`scaling.slo.predict`): out
when the model predicts, at the current arrival rate and batch occupancy, that the ready
runners break a target for want of runners (one more would do better); in only when it
predicts one fewer still meets every target with `IN_HEADROOM` to spare, holding the
recent peak, or does no worse than now where prefill alone breaks it. Pure.

`slo_with_model` is what the `slo` policy asks: the model's scale-out first, then the
measured p90's (a break the model did not foresee still adds a runner), then the model's
scale-in instead of the measured rule's; the measured rule alone where the model cannot
judge.
"""

from __future__ import annotations

import math

from ebb.coldstart.latency_model import LatencyFit, Prediction, predict
from ebb.coldstart.scaling_inputs import Measured
from ebb.coldstart.scaling_slo import IN_HEADROOM, slo_verdict
from ebb.coldstart.scaling_verdict import HOLD, Verdict
from ebb.queue.scaling_spec import SloTarget

# A latency that more runners would bring below this share of it is short of runners.
CAPACITY_GAIN = 0.95


def slo_with_model(
    measured: Measured, target: SloTarget, ready: int, *, queued: int, slots: int
) -> Verdict:
    """`slo_verdict`'s contract, with the model where `target.predict` is on."""
    by_model = None
    if target.predict:
        by_model = model_verdict(
            measured.latency_fit,
            target,
            ready,
            slots_per_runner=slots // ready if ready else 0,
            held_now=sum(measured.held.values()) + queued,
            peak_held=measured.peak_held,
        )
    if by_model is not None and by_model.direction > 0:
        return by_model
    by_p90 = slo_verdict(measured, target, ready, queued=queued, slots=slots)
    if by_model is None or by_p90.direction > 0 or (by_p90.direction == 0 and by_p90.why):
        return by_p90
    return by_model


def model_verdict(
    fit: LatencyFit | None,
    target: SloTarget,
    ready: int,
    *,
    slots_per_runner: int,
    held_now: int,
    peak_held: int,
) -> Verdict | None:
    """+1 or -1 with the prediction as the reason, HOLD, or None: the model cannot judge
    (off, too few samples, no runner, or a targeted TPOT with no fitted line)."""
    if fit is None or ready < 1:
        return None
    now = predict(fit, ready, slots_per_runner, held_now)
    if target.tpot_p90_s is not None and now.tpot_s is None:
        return None
    more = predict(fit, ready + 1, slots_per_runner, held_now)
    broken = _short_of_runners(now, more, target, 1.0)
    if broken:
        return Verdict(+1, f"model predicts {now.describe()}: {broken}")
    if ready < 2:
        return HOLD  # the last runner goes by keep-alive, not by the target
    fewer = predict(fit, ready - 1, slots_per_runner, peak_held)
    if fewer.batch > slots_per_runner * IN_HEADROOM:
        return HOLD  # the others' slots would be nearly full: the next burst would queue
    if _short_of_runners(fewer, now, target, IN_HEADROOM):
        return HOLD
    return Verdict(-1, f"model predicts {fewer.describe()}: within the target")


def _short_of_runners(p: Prediction, more: Prediction, target: SloTarget, share: float) -> str:
    """Which target `p` breaks at `share` of it for want of runners ("" none): where
    `more` runners would do better. A TTFT over the target on free slots is the prompt's
    prefill, the same on any number of runners: not a reason to add (or keep) one."""
    pairs = [
        ("ttft", p.ttft_s, more.ttft_s, target.ttft_p90_s),
        ("tpot", p.tpot_s, more.tpot_s, target.tpot_p90_s),
    ]
    for name, value, better, goal in pairs:
        if goal is None or value is None or value <= goal * share:
            continue
        if math.isinf(value) or (better is not None and better < value * CAPACITY_GAIN):
            return f"{name} > {goal * share:g}s"
    return ""
