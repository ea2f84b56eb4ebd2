"""Autoscaling policy: a pure function from a demand snapshot to a desired replica count.

Scale-up only: replicas go away by idle drain in the runner itself, never by the
controller killing one, so in-flight work is never cut short.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyConfig:
    # Queueing must last this long with every runner busy before another one is added.
    scale_up_after_s: float = 2.0


@dataclass(frozen=True)
class DemandSnapshot:
    queue_depth: int
    oldest_wait_s: float
    starting: int  # launched or loading: capacity that is on its way
    ready: int
    min_replicas: int
    max_replicas: int
    target_concurrency: int

    @property
    def serving(self) -> int:
        return self.starting + self.ready


def desired_replicas(snap: DemandSnapshot, config: PolicyConfig = PolicyConfig()) -> int:
    """How many runners (starting + ready) the deployment should have now."""
    desired = max(snap.serving, snap.min_replicas)
    if snap.queue_depth > 0 and snap.serving == 0:
        # Cold-start fast path: every queued request waits on this launch; start enough
        # runners for the queue at once rather than one per reconcile.
        desired = max(desired, math.ceil(snap.queue_depth / max(snap.target_concurrency, 1)))
    elif (
        snap.queue_depth > 0
        and snap.starting == 0
        and snap.oldest_wait_s >= config.scale_up_after_s
    ):
        # Sustained queueing with all capacity up and busy: one more at a time, waiting for
        # each to arrive before judging again (hysteresis without flapping).
        desired = snap.serving + 1
    return max(0, min(desired, snap.max_replicas))
