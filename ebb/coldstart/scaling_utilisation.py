"""The utilisation rule (design 3c): busy above `up_pct` for `up_for_s` adds a replica;
below `down_pct` for `down_for_s` drains one. Pure.

A window counts only when the samples cover it: a deployment measured for two minutes
has not been "below 25 % for 30 minutes".
"""

from __future__ import annotations

from collections.abc import Sequence

from ebb.coldstart.scaling_verdict import HOLD, Verdict
from ebb.queue.scaling_spec import UtilisationRule


def _window(
    samples: Sequence[tuple[float, float]], now_s: float, for_s: float
) -> list[float] | None:
    """The shares measured in the last `for_s` (None: the samples do not reach back)."""
    if not samples or samples[0][0] > now_s - for_s:
        return None
    return [share for at_s, share in samples if at_s >= now_s - for_s]


def utilisation_verdict(
    samples: Sequence[tuple[float, float]], now_s: float, rule: UtilisationRule
) -> Verdict:
    up = _window(samples, now_s, rule.up_for_s)
    if up and min(up) * 100 > rule.up_pct:
        return Verdict(
            +1,
            f"utilisation above {rule.up_pct:g}% for {rule.up_for_s:g}s "
            f"(lowest {min(up) * 100:.0f}%)",
        )
    down = _window(samples, now_s, rule.down_for_s)
    if down and max(down) * 100 < rule.down_pct:
        return Verdict(
            -1,
            f"utilisation below {rule.down_pct:g}% for {rule.down_for_s:g}s "
            f"(highest {max(down) * 100:.0f}%)",
        )
    return HOLD
