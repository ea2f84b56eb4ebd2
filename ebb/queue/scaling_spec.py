"""A deployment's scaling block (`DeploymentSpec.scaling`): which policy sizes it, its
latency target, its utilisation rule, its keep-alive and its schedule of minimum replicas.

The defaults: the queue-only policy, the hybrid histogram keep-alive (per level of need,
the fixed idle window `idle_timeout_s` while a level's history is short), no schedule.
`QUEUE_ONLY` is the block that adds nothing to the queue rule (the default before the
hybrid keep-alive was). `ebb.coldstart.scaling` reads this block; the deploy API validates
it (`routes_scaling.ScalingBody`).
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


# A time of day as the API takes it: two ASCII digits each (str.isdigit also takes "²"
# and other scripts' digits), 00:00 to 23:59; a window to midnight ends at "00:00".
_HHMM = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")


def parse_hhmm(text: str) -> int:
    """Minutes after midnight of "HH:MM" (ValueError, saying what it must be, otherwise)."""
    match = _HHMM.fullmatch(text)
    if match is None:
        raise ValueError(
            f"{text[:16]!r} is not a time of day: HH:MM in ASCII digits, 00:00 to 23:59 "
            '(a window that ends at midnight ends at "00:00")'
        )
    return int(match[1]) * 60 + int(match[2])


def stored_minutes(text: str) -> int:
    """`parse_hhmm` of a stored schedule's time, and "24:00", which the API once took
    (a window ending at midnight), as 1440."""
    return 24 * 60 if text == "24:00" else parse_hhmm(text)


class SloTarget(msgspec.Struct, kw_only=True, frozen=True):
    """p90 latencies the deployment keeps, measured over `window_s` (None: not targeted)."""

    ttft_p90_s: float | None = None
    tpot_p90_s: float | None = None
    window_s: float = 60.0
    # Also act on the online latency model (`coldstart.latency_model`): out when it
    # predicts a break at the current rate, in only when it predicts one fewer meets it.
    predict: bool = False


class UtilisationRule(msgspec.Struct, kw_only=True, frozen=True):
    """The operating rule: above `up_pct` busy for `up_for_s` adds a replica; below
    `down_pct` for `down_for_s` drains one."""

    up_pct: float = 70.0
    up_for_s: float = 300.0
    down_pct: float = 25.0
    down_for_s: float = 1800.0


class ScheduleEntry(msgspec.Struct, kw_only=True, frozen=True):
    """At least `min_replicas` ready on `days` from `start` to `end` ("HH:MM", in `tz`; an
    `end` at or before `start` runs past midnight)."""

    days: tuple[str, ...] = WEEKDAYS
    start: str = msgspec.field(name="from", default="00:00")
    end: str = msgspec.field(name="to", default="00:00")
    tz: str = "UTC"
    min_replicas: int = 1


class ScalingSpec(msgspec.Struct, kw_only=True, frozen=True):
    policy: Literal["queue", "slo", "utilisation"] = "queue"
    slo: SloTarget | None = None
    utilisation: UtilisationRule = UtilisationRule()
    # fixed: the idle window (`idle_timeout_s`); learned: from the deployment's own idle
    # times (Shahrad et al.'s hybrid histogram), the idle window while history is short.
    # hybrid: keep-alive and pre-warm windows per level of need (`coldstart.histogram`);
    # the default, as the simulator puts it beyond the fixed windows' curve on both Azure
    # traces (docs/COLDSTART.md).
    keep_alive: Literal["fixed", "learned", "hybrid"] = "hybrid"
    # Pre-warm one more runner ahead of a rising demand (`coldstart.trend`).
    trend: bool = False
    schedule: tuple[ScheduleEntry, ...] = ()
    # A scale-out after a scale-in (or the reverse) waits at least this long.
    reversal_gap_s: float = 300.0


# The queue-only rule and the runners' own idle timeout, nothing more: a deployment on this
# block needs no measurements, and a retired version's unit is put on it.
QUEUE_ONLY = ScalingSpec(keep_alive="fixed")
