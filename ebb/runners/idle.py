"""The idle runner's decision: keep serving, go to sleep, or drain (scale down by one).

A pure function so that the runner (`serve.ServingLoop`) and the autoscaling simulator
(`ebb.coldstart.simulation`) decide alike. Its atomic half is not here: a runner that
decided to sleep or drain still does so only if nothing waits in its deployment's queues,
checked and applied in one step by `try_sleep.lua` / `try_drain.lua`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable


class IdleAction(enum.Enum):
    KEEP = "keep"  # keep serving (claiming) as before
    SLEEP = "sleep"  # park the engine asleep, stay wakeable (engines with sleep mode)
    DRAIN = "drain"  # stop claiming, finish, exit


def idle_action(
    *,
    idle_s: float,
    idle_timeout_s: float,
    min_replicas: int,
    serving_runners: Callable[[], int],
    supports_sleep: bool,
) -> IdleAction:
    """What a runner holding no work does after `idle_s` seconds without any.

    Past the deployment's idle timeout, and only while more runners serve the deployment
    than its `min_replicas` (counting this one), it gives its capacity back: asleep where
    its engine can sleep, else by draining. `serving_runners` is called only past the
    timeout (it costs the runner a round trip)."""
    if idle_s < idle_timeout_s:
        return IdleAction.KEEP
    if serving_runners() <= min_replicas:
        return IdleAction.KEEP
    return IdleAction.SLEEP if supports_sleep else IdleAction.DRAIN
