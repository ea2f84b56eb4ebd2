"""The latency target (`scaling.slo`): out when a measured p90 breaks its target, in when
the remaining runners would still meet it. Pure.

A broken target adds a runner only where capacity is what it lacks: something queues,
or the runners' slots are at least `OUT_BUSY_SHARE` full. A slow first token on runners
with free slots is the prompt's length (prefill), which another runner would not change.

"Would still meet it": the recent peak of requests held at once fits the other runners'
slots `IN_HEADROOM` full, and, with latency taken to grow with the load each runner
carries (n/(n-1) of today's), the p90 stays under `IN_HEADROOM` of the target.
"""

from __future__ import annotations

from ebb.coldstart.scaling_inputs import Measured
from ebb.coldstart.scaling_verdict import HOLD, Verdict
from ebb.queue.scaling_spec import SloTarget

IN_HEADROOM = 0.7
OUT_BUSY_SHARE = 0.5


def slo_verdict(
    measured: Measured, target: SloTarget, ready: int, *, queued: int, slots: int
) -> Verdict:
    """`queued`: requests waiting; `slots`: the ready runners' batch slots."""
    pairs = [
        ("ttft", measured.ttft_p90_s, target.ttft_p90_s),
        ("tpot", measured.tpot_p90_s, target.tpot_p90_s),
    ]
    judged = [(name, p90, goal) for name, p90, goal in pairs if goal is not None]
    busy = sum(measured.held.values()) / slots if slots else 1.0
    for name, p90, goal in judged:
        if p90 is not None and p90 > goal:
            broken = f"p90 {name} {p90:.3f}s > target {goal:g}s"
            if queued or busy >= OUT_BUSY_SHARE:
                return Verdict(+1, f"{broken} ({queued} queued, slots {busy:.0%} busy)")
            return Verdict(0, f"{broken}, but slots {busy:.0%} busy: not for lack of runners")
    if ready < 2 or not judged:
        return HOLD  # the last runner goes by keep-alive, not by the target
    per_runner = slots / ready if ready else 0
    if measured.peak_held > (ready - 1) * per_runner * IN_HEADROOM:
        return HOLD  # the recent peak would fill the others: something would queue
    grown = ready / (ready - 1)
    for _, p90, goal in judged:
        if p90 is None or p90 * grown > goal * IN_HEADROOM:
            return HOLD
    shown = ", ".join(f"p90 {n} {p:.3f}s" for n, p, _ in judged if p is not None)
    return Verdict(-1, f"{shown}: {ready - 1} runners would still meet the target")
