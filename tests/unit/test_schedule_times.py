"""A schedule's times are a tenant's strings: HH:MM in ASCII digits, 00:00 to 23:59."""

from __future__ import annotations

import datetime as dt

import pytest
from pydantic import ValidationError

from ebb.coldstart.schedule import active
from ebb.frontdoor.routes_scaling import ScheduleBody
from ebb.queue.scaling_spec import ScheduleEntry, parse_hhmm


@pytest.mark.parametrize(("text", "minutes"), [("00:00", 0), ("09:05", 545), ("23:59", 1439)])
def test_times_of_day_are_read(text, minutes):
    assert parse_hhmm(text) == minutes


# "٠٩:٠٠" (Arabic-Indic digits) and "０９:００" (fullwidth) pass str.isdigit and int();
# "0²:00" passes str.isdigit only.
BAD = ["24:00", "٠٩:٠٠", "０９:００", "0²:00", "9:00", "09:0", "09:60", "-1:00", " 09:00", "0900"]


@pytest.mark.parametrize("text", BAD)
def test_anything_else_is_refused_saying_what_a_time_is(text):
    with pytest.raises(ValueError, match="HH:MM in ASCII digits, 00:00 to 23:59"):
        parse_hhmm(text)
    entry = {"days": ["mon"], "from": "09:00", "to": text, "min_replicas": 1}
    with pytest.raises(ValidationError, match="00:00 to 23:59"):
        ScheduleBody.model_validate(entry)


def test_a_window_to_midnight_ends_at_0000_and_a_stored_2400_still_reads():
    monday_23h = dt.datetime(2026, 12, 7, 23, 30, tzinfo=dt.UTC).timestamp()
    tuesday_1h = monday_23h + 2 * 3600
    for end in ("00:00", "24:00"):  # "24:00": what the API took before
        entry = ScheduleEntry(days=("mon",), start="09:00", end=end, tz="UTC", min_replicas=1)
        assert active(entry, monday_23h) and not active(entry, tuesday_1h)
