"""Budget periods: which UTC day or month an instant falls in, when it resets, and the
label its spend key carries (a new period is a new key, so spend starts from zero)."""

from __future__ import annotations

import datetime as dt

import pytest

from ebb.queue.budget_periods import Period, iso, period_label, period_start, resets_at


def _s(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


@pytest.mark.parametrize(
    ("period", "at", "label", "start", "reset"),
    [
        (Period.DAY, "2026-12-06T10:39:03+00:00", "d20261206",
         "2026-12-06T00:00:00Z", "2026-12-07T00:00:00Z"),
        (Period.DAY, "2026-12-31T23:59:59.999+00:00", "d20261231",
         "2026-12-31T00:00:00Z", "2027-01-01T00:00:00Z"),
        # An instant written in another zone counts in UTC.
        (Period.DAY, "2026-12-07T01:00:00+02:00", "d20261206",
         "2026-12-06T00:00:00Z", "2026-12-07T00:00:00Z"),
        (Period.MONTH, "2026-12-06T10:00:00+00:00", "m202612",
         "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"),
        (Period.MONTH, "2028-02-29T23:00:00+00:00", "m202802",
         "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"),
        (Period.LIFETIME, "2026-12-06T10:00:00+00:00", "life", None, None),
    ],
)  # fmt: skip
def test_period_of_an_instant(period, at, label, start, reset):
    now_s = _s(at)
    assert period_label(period, now_s) == label
    assert iso(period_start(period, now_s)) == start
    assert iso(resets_at(period, now_s)) == reset


def test_the_next_period_starts_at_the_reset_with_a_new_label():
    now_s = _s("2026-12-06T23:59:59+00:00")
    for period in (Period.DAY, Period.MONTH):
        reset = resets_at(period, now_s)
        assert reset is not None
        assert period_label(period, reset.timestamp()) != period_label(period, now_s)
        assert period_start(period, reset.timestamp()) == reset
        # The last instant before the reset still belongs to the old period.
        before = reset.timestamp() - 0.001
        assert period_label(period, before) == period_label(period, now_s)
