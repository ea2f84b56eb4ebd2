"""Rollout transitions and the health judgment of an automatic one: pure functions over
`TrafficSplit` (ebb.queue.versions), shared by the API (start, promote, roll back) and the
controller (warm-up done, scheduled steps, automatic rollback).

A transition that makes no sense in the split's state raises `RolloutRefused` with a
message saying what to do instead (the API's 409).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from ebb.queue.schema import UsageRecord
from ebb.queue.versions import Rollout, TrafficSplit


class RolloutRefused(Exception):
    pass


def canary_steps(canary_pct: int | None, steps: list[int] | None) -> list[int]:
    """The new version's shares, ascending, ending at 100: `steps` as given, or the canary
    share then 50 then 100; immediate: [100]."""
    if steps:
        chosen = sorted(set(steps))
    elif canary_pct is not None:
        chosen = sorted({canary_pct, max(canary_pct, 50), 100})
    else:
        chosen = [100]
    return chosen if chosen[-1] == 100 else [*chosen, 100]


def start(split: TrafficSplit, rollout: Rollout) -> TrafficSplit:
    """Begin moving traffic to `rollout.to_version`; it warms first (no traffic yet).
    Versions already at 0 % leave the split: they had a whole rollout to drain."""
    if split.rollout is not None and split.rollout.active:
        raise RolloutRefused(
            f"version {split.rollout.to_version} is being rolled out; promote it, roll it "
            "back or wait for it to finish first."
        )
    if split.weights.get(rollout.to_version, 0) == 100:
        raise RolloutRefused(f"version {rollout.to_version} already takes all the traffic.")
    weights = {v: w for v, w in split.weights.items() if w > 0}
    weights.setdefault(rollout.to_version, 0)
    return TrafficSplit(weights=weights, rollout=rollout)


def warmed(split: TrafficSplit, now_s: float) -> TrafficSplit:
    """The new version has a ready runner: its first step's share goes to it."""
    rollout = _active(split)
    if rollout.state != "warming":
        raise RolloutRefused(f"version {rollout.to_version} already takes traffic.")
    return _at_step(split, rollout, 0, now_s)


def promote(split: TrafficSplit, now_s: float) -> TrafficSplit:
    """The next step (the last one: all traffic, the rollout is done). A rollout still
    warming up is promoted once it has a ready runner, never before."""
    rollout = _active(split)
    if rollout.state == "warming":
        raise RolloutRefused(
            f"version {rollout.to_version} has no ready runner yet; traffic moves to it "
            "once it does (GET .../versions shows its status)."
        )
    return _at_step(split, rollout, rollout.step + 1, now_s)


def rollback(split: TrafficSplit, reason: str, now_s: float) -> TrafficSplit:
    """All traffic back to the version the rollout started from; the new one drains."""
    rollout = split.rollout
    if rollout is None or rollout.state == "rolled_back":
        raise RolloutRefused("there is no rollout to roll back; deploy and roll out a version.")
    back = msgspec.structs.replace(rollout, state="rolled_back", reason=reason)
    back.step_started_at_s = now_s
    return split.with_share(back)


def _active(split: TrafficSplit) -> Rollout:
    if split.rollout is None or not split.rollout.active:
        raise RolloutRefused("no rollout is in progress; start one with POST .../rollout.")
    return split.rollout


def _at_step(split: TrafficSplit, rollout: Rollout, step: int, now_s: float) -> TrafficSplit:
    step = min(step, len(rollout.steps) - 1)
    state = "done" if rollout.steps[step] == 100 else "running"
    moved = msgspec.structs.replace(rollout, step=step, state=state, step_started_at_s=now_s)
    return split.with_share(moved)


# --- health of an automatic rollout ---------------------------------------------------


@dataclass(frozen=True)
class VersionHealth:
    requests: int
    failed: int
    p99_ttft_ms: float | None

    @property
    def error_rate(self) -> float:
        return self.failed / self.requests if self.requests else 0.0


def health_of(records: Iterable[UsageRecord], deployment: str) -> dict[int, VersionHealth]:
    """Per version of `deployment`: finished and failed requests (a client's cancel is
    neither) and the 99th percentile of time to first token."""
    counts: dict[int, list[int]] = {}
    ttfts: dict[int, list[float]] = {}
    for r in records:
        if r.deployment != deployment or r.state == "cancelled":
            continue
        c = counts.setdefault(r.version, [0, 0])
        c[0] += 1
        c[1] += r.state == "failed"
        if r.ttft_ms is not None:
            ttfts.setdefault(r.version, []).append(r.ttft_ms)
    return {v: VersionHealth(c[0], c[1], _p99(ttfts.get(v, []))) for v, c in counts.items()}


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


class Verdict(enum.StrEnum):
    WAIT = "wait"
    PROMOTE = "promote"
    ROLL_BACK = "roll_back"


def judge(
    rollout: Rollout, old: VersionHealth | None, new: VersionHealth | None, now_s: float
) -> tuple[Verdict, str]:
    """What a scheduled rollout does now, and why. The new version is judged as soon as
    it has `min_requests`; it is promoted once the step's interval is over and it held."""
    if new is not None and new.requests >= rollout.min_requests:
        old_rate = old.error_rate if old is not None and old.requests else 0.0
        if new.error_rate > old_rate + rollout.max_error_rate_increase:
            return Verdict.ROLL_BACK, (
                f"version {rollout.to_version}'s error rate {new.error_rate:.1%} exceeds "
                f"version {rollout.from_version}'s {old_rate:.1%} by more than "
                f"{rollout.max_error_rate_increase:.1%}"
            )
        old_p99 = old.p99_ttft_ms if old is not None else None
        if old_p99 and new.p99_ttft_ms is not None:
            limit = old_p99 * (1 + rollout.max_ttft_increase_pct / 100)
            if new.p99_ttft_ms > limit:
                return Verdict.ROLL_BACK, (
                    f"version {rollout.to_version}'s p99 time to first token "
                    f"{new.p99_ttft_ms:.0f} ms exceeds version {rollout.from_version}'s "
                    f"{old_p99:.0f} ms by more than {rollout.max_ttft_increase_pct:g}%"
                )
    if now_s - rollout.step_started_at_s < rollout.interval_s:
        return Verdict.WAIT, ""
    if new is None or new.requests < rollout.min_requests:
        return Verdict.WAIT, "waiting for enough requests to judge"
    return Verdict.PROMOTE, ""
