"""One deployment's scaling decision under its `scaling` block: how many runners it
should have, which ready runners to drain, and why. Pure; `plan.plan` acts on it.

In order: the queue-only rule (`policy.desired_replicas`, today's default, and always the
cold-start fast path from zero); the scheduled minimum, looked up ahead by the expected
cold-start time; the chosen policy's verdict (`scaling_slo`, `scaling_utilisation`),
held back by the reversal gap (`hysteresis`); then, with learned keep-alive, the ready
runners idle past the learned window are given back. Scale-in drains the least useful
runner (holding the fewest requests, then the newest) and never below the floor
(`min_replicas` or the schedule's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ebb.coldstart.histogram import MIN_PERIODS
from ebb.coldstart.hysteresis import reversal_wait_s
from ebb.coldstart.keepalive import keep_alive_drains
from ebb.coldstart.policy import DemandSnapshot, PolicyConfig, desired_replicas
from ebb.coldstart.scaling_hybrid import hybrid_move, trend_move
from ebb.coldstart.scaling_inputs import Measured
from ebb.coldstart.scaling_slo_model import slo_with_model
from ebb.coldstart.scaling_utilisation import utilisation_verdict
from ebb.coldstart.scaling_verdict import HOLD, Verdict
from ebb.coldstart.schedule import minimum_at
from ebb.queue.scaling_spec import ScalingSpec


@dataclass(frozen=True)
class ScaleDecision:
    desired: int
    drain: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    direction: int = 0  # +1 a policy's scale-out, -1 a scale-in (for the reversal gap)
    # A policy wanted a move it did not make (the reversal gap, or not capacity-bound):
    # logged, so that the operator reads why nothing happened.
    held: bool = False

    def worth_logging(self, serving: int) -> bool:
        return bool(self.reasons) and (bool(self.drain) or self.desired != serving or self.held)


def may_start_unqueued(scaling: ScalingSpec, measured: Measured) -> bool:
    """Whether `scaling` could start a runner with nothing queued now: a policy, the trend
    or a schedule always may; the hybrid keep-alive only once a level's history is long
    enough to place a pre-warm point. (The controller reads nodes and GPU needs only for
    a deployment that may start: on a cluster, listing nodes is an API call.)"""
    if scaling.policy != "queue" or scaling.trend or scaling.schedule:
        return True
    return scaling.keep_alive == "hybrid" and any(
        len(periods) >= MIN_PERIODS for periods in measured.level_periods_s
    )


def decide(
    scaling: ScalingSpec,
    snap: DemandSnapshot,
    measured: Measured,
    *,
    ready: Sequence[str],
    wall_s: float,
    cold_start_s: float,
    fixed_keep_alive_s: float,
    config: PolicyConfig = PolicyConfig(),
    start_s: float | None = None,
) -> ScaleDecision:
    """`ready`: the deployment's ready runners, oldest first. `cold_start_s`: the
    slowest tier's cold start (the schedule's lead); `start_s`: the next start's expected
    one (the pre-warm's and trend's lead; default `cold_start_s`)."""
    desired = desired_replicas(snap, config)
    reasons: list[str] = []
    if desired > snap.serving:
        reasons.append(f"queue: {snap.queue_depth} waiting")
    floor, why = minimum_at(scaling.schedule, wall_s, cold_start_s)
    floor = min(max(floor, snap.min_replicas), snap.max_replicas)
    if floor > desired:
        desired = floor
        reasons.append(f"{why}: at least {floor}")
    wanted = _verdict(scaling, snap, measured, wall_s)
    verdict = _held(wanted, scaling, measured, wall_s)
    if verdict.why:
        reasons.append(verdict.why)
    drain: list[str] = []
    if verdict.direction > 0 and snap.starting == 0:
        desired = max(desired, min(snap.serving + 1, snap.max_replicas))
    elif verdict.direction < 0 and snap.starting == 0 and snap.queue_depth == 0:
        drain += _least_useful(ready, measured, snap.serving - floor, 1)
    if scaling.keep_alive == "learned" and snap.queue_depth == 0 and snap.starting == 0:
        idle = [r for r in ready if r not in drain and measured.held.get(r, 0) == 0]
        given, why = keep_alive_drains(
            measured,
            _least_useful(idle, measured, len(idle), len(idle)),
            ready=snap.serving - len(drain),
            floor=floor,
            max_concurrency=snap.target_concurrency,
            fixed_s=fixed_keep_alive_s,
        )
        if given:
            drain += given
            reasons.append(f"keep-alive: {why}")
    desired = _hybrid_and_trend(
        scaling,
        snap,
        measured,
        ready,
        drain,
        reasons,
        desired,
        floor,
        cold_start_s if start_s is None else start_s,
        fixed_keep_alive_s,
    )
    # Any scale-out (the queue rule's or the schedule's too) starts the reversal gap: a
    # policy's scale-in right after it would be the flapping the gap exists to stop.
    applied = 1 if desired > snap.serving else 0
    if verdict.direction < 0 and drain:
        applied = -1
    held = bool(verdict.why) and verdict.direction == 0
    return ScaleDecision(desired, tuple(drain), tuple(reasons), applied, held)


def _hybrid_and_trend(
    scaling: ScalingSpec,
    snap: DemandSnapshot,
    measured: Measured,
    ready: Sequence[str],
    drain: list[str],
    reasons: list[str],
    desired: int,
    floor: int,
    cold_start_s: float,
    fixed_s: float,
) -> int:
    """`desired` with the hybrid histogram's pre-warm and the trend's; adds the hybrid
    keep-alive's drains to `drain` and every reason to `reasons`. Neither acts while
    something is queued (the queue rule sizes the deployment then) or is starting."""
    if snap.queue_depth or snap.starting:
        return desired
    serving = snap.serving - len(drain)
    if scaling.keep_alive == "hybrid":
        idle = [r for r in ready if r not in drain and measured.held.get(r, 0) == 0]
        move = hybrid_move(
            measured,
            _least_useful(idle, measured, len(idle), len(idle)),
            serving=serving,
            floor=floor,
            max_replicas=snap.max_replicas,
            fixed_s=fixed_s,
            cold_start_s=cold_start_s,
        )
        drain += move.drain
        reasons += move.reasons
        serving -= len(move.drain)
        if move.start:
            desired = max(desired, min(serving + move.start, snap.max_replicas))
    if scaling.trend and not drain:
        extra, why = trend_move(
            measured,
            serving=serving,
            max_replicas=snap.max_replicas,
            max_concurrency=snap.target_concurrency,
            cold_start_s=cold_start_s,
        )
        if extra:
            desired = max(desired, serving + extra)
            reasons.append(why)
    return desired


def _verdict(
    scaling: ScalingSpec, snap: DemandSnapshot, measured: Measured, now_s: float
) -> Verdict:
    if scaling.policy == "slo" and scaling.slo is not None:
        slots = snap.ready * snap.target_concurrency
        return slo_with_model(
            measured, scaling.slo, snap.ready, queued=snap.queue_depth, slots=slots
        )
    if scaling.policy == "utilisation":
        return utilisation_verdict(measured.utilisation, now_s, scaling.utilisation)
    return HOLD


def _held(verdict: Verdict, scaling: ScalingSpec, measured: Measured, now_s: float) -> Verdict:
    if not verdict.direction:
        return verdict
    wait_s = reversal_wait_s(verdict.direction, measured, now_s, scaling.reversal_gap_s)
    if wait_s <= 0:
        return verdict
    return Verdict(
        0, f"{verdict.why}; held {wait_s:.0f}s more (one reversal per {scaling.reversal_gap_s:g}s)"
    )


def _least_useful(
    candidates: Sequence[str], measured: Measured, spare: int, most: int
) -> list[str]:
    """Up to `most` (and `spare`) of `candidates` to drain: holding the fewest requests,
    then the newest (the oldest keeps its warm caches)."""
    if spare <= 0 or most <= 0:
        return []
    order = sorted(range(len(candidates)), key=lambda i: (measured.held.get(candidates[i], 0), -i))
    return [candidates[i] for i in order[: min(spare, most)]]
