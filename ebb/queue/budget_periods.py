"""Budget periods: a UTC day, a UTC calendar month, or the whole lifetime.

A budget's spend is counted per period under a key that carries the period's start
(`label`), so a new period starts from zero without anything having to reset it: the
first request of the day simply finds no spend under the new day's key. Pure functions of
a UTC instant; the frontdoor passes its own clock (a few milliseconds of skew between
frontdoors only decide which side of midnight a request lands on).
"""

from __future__ import annotations

import datetime as dt
import enum
import functools

LIFETIME_LABEL = "life"


class Period(enum.StrEnum):
    DAY = "day"
    MONTH = "month"
    LIFETIME = "lifetime"  # the API's null period: never resets


# A UTC day in Unix time, which counts no leap seconds: every day is this long.
_DAY_S = 86_400


def period_start(period: Period, now_s: float) -> dt.datetime | None:
    """The UTC instant the period holding `now_s` began (None: a lifetime has no start)."""
    if period is Period.LIFETIME:
        return None
    return _start(period, int(now_s // _DAY_S))


# Each budgeted request works out its periods several times (its spend keys, its
# soft-limit event): remembered per UTC day, they are worked out once a day.
@functools.lru_cache(maxsize=64)
def _start(period: Period, day: int) -> dt.datetime:
    day_start = dt.datetime.fromtimestamp(day * _DAY_S, tz=dt.UTC)
    return day_start if period is Period.DAY else day_start.replace(day=1)


def resets_at(period: Period, now_s: float) -> dt.datetime | None:
    """When the period holding `now_s` ends and spend starts from zero (None: never)."""
    start = period_start(period, now_s)
    if start is None:
        return None
    if period is Period.DAY:
        return start + dt.timedelta(days=1)
    if start.month == 12:
        return start.replace(year=start.year + 1, month=1)
    return start.replace(month=start.month + 1)


def period_label(period: Period, now_s: float) -> str:
    """The period's name in its spend key: "d20261206", "m202612" or "life"."""
    if period is Period.LIFETIME:
        return LIFETIME_LABEL
    return _label(period, int(now_s // _DAY_S))


@functools.lru_cache(maxsize=64)
def _label(period: Period, day: int) -> str:
    return _start(period, day).strftime("d%Y%m%d" if period is Period.DAY else "m%Y%m")


def iso(moment: dt.datetime | None) -> str | None:
    """`2026-12-07T00:00:00Z`, as the API writes instants; None stays None."""
    return None if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%SZ")
