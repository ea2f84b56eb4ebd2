"""A schedule's time zone is a tenant's string: only names of the tz database pass."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ebb.frontdoor.routes_scaling import ScheduleBody


def _entry(tz: str) -> dict:
    return {"days": ["mon"], "from": "09:00", "to": "18:00", "tz": tz, "min_replicas": 1}


@pytest.mark.parametrize("tz", ["Europe/Paris", "UTC", "America/Argentina/Buenos_Aires"])
def test_a_named_zone_is_accepted(tz):
    assert ScheduleBody.model_validate(_entry(tz)).tz == tz


# `posixrules` and `zone1970.tab` are files under the tz path that are not zone names (the
# first one ZoneInfo even opens); the rest are paths.
@pytest.mark.parametrize("tz", ["posixrules", "zone1970.tab", "../../etc/passwd", "/etc/localtime"])
def test_anything_else_is_refused_naming_the_zone(tz):
    with pytest.raises(ValidationError, match="is not an IANA time zone"):
        ScheduleBody.model_validate(_entry(tz))
