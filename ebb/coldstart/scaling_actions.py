"""The actions a scaling policy adds to a plan (`plan.Action` includes them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DrainReady:
    """Make a ready runner of the deployment stop claiming, finish what it holds and exit
    (its scaling policy or learned keep-alive gives it back; `scaling.decide`)."""

    runner_id: str
    deployment: str
    reason: str


@dataclass(frozen=True)
class Scaled:
    """A scaling policy's decision, for the decision log and the reversal gap: `desired`
    runners, `direction` +1 out / -1 in / 0 neither, and why."""

    deployment: str
    policy: str
    desired: int
    direction: int
    reasons: tuple[str, ...]
