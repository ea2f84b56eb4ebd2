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

LIFETIME_LABEL = "life"


class Period(enum.StrEnum):
    DAY = "day"
    MONTH = "month"
    LIFETIME = "lifetime"  # the API's null period: never resets


def period_start(period: Period, now_s: float) -> dt.datetime | None:
    """The UTC instant the period holding `now_s` began (None: a lifetime has no start)."""
    now = dt.datetime.fromtimestamp(now_s, tz=dt.UTC)
    if period is Period.DAY:
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period is Period.MONTH:
        return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return None


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
    start = period_start(period, now_s)
    if start is None:
        return LIFETIME_LABEL
    return start.strftime("d%Y%m%d" if period is Period.DAY else "m%Y%m")


def iso(moment: dt.datetime | None) -> str | None:
    """`2026-12-07T00:00:00Z`, as the API writes instants; None stays None."""
    return None if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%SZ")
