"""Budget periods worked out once a UTC day: the same starts and labels as working each
instant out on its own, on both sides of a day's and a month's end."""

from __future__ import annotations

import datetime as dt

import pytest

from ebb.queue.budget_periods import Period, period_label, period_start


def _reference(period: Period, now_s: float) -> tuple[dt.datetime | None, str]:
    now = dt.datetime.fromtimestamp(now_s, tz=dt.UTC)
    if period is Period.LIFETIME:
        return None, "life"
    start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period is Period.MONTH:
        start = start.replace(day=1)
    return start, start.strftime("d%Y%m%d" if period is Period.DAY else "m%Y%m")


MIDNIGHTS = ["2026-12-06", "2026-12-31", "2027-01-01", "2028-02-29", "1969-12-31", "2026-03-01"]


@pytest.mark.parametrize("period", list(Period))
@pytest.mark.parametrize("midnight", MIDNIGHTS)
def test_periods_across_midnight_are_those_of_each_instant(period, midnight):
    at_s = dt.datetime.fromisoformat(f"{midnight}T00:00:00+00:00").timestamp()
    for offset_s in (-86_399.5, -3600, -1, -0.001, 0, 0.001, 1, 43_200.25, 86_399.999):
        now_s = at_s + offset_s
        assert (period_start(period, now_s), period_label(period, now_s)) == _reference(
            period, now_s
        ), (period, midnight, offset_s)
