"""Scheduled minimum replicas: which `ScheduleEntry` holds at a wall-clock moment.

Pure. `minimum_at` looks `lead_s` ahead as well, so that runners are started by the
expected cold-start time before a window opens and are ready when it does, not after.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from zoneinfo import ZoneInfo

from ebb.queue.scaling_spec import WEEKDAYS, ScheduleEntry, stored_minutes


def active(entry: ScheduleEntry, wall_s: float) -> bool:
    """Whether `entry` holds at `wall_s` (a window past midnight belongs to the day it
    starts on)."""
    local = dt.datetime.fromtimestamp(wall_s, ZoneInfo(entry.tz))
    minute = local.hour * 60 + local.minute + local.second / 60
    start, end = stored_minutes(entry.start), stored_minutes(entry.end)
    today = WEEKDAYS[local.weekday()]
    yesterday = WEEKDAYS[(local.weekday() - 1) % 7]
    if start < end:
        return today in entry.days and start <= minute < end
    # Past midnight (or the whole day when start == end).
    return (today in entry.days and minute >= start) or (yesterday in entry.days and minute < end)


def minimum_at(
    entries: Sequence[ScheduleEntry], wall_s: float, lead_s: float = 0.0
) -> tuple[int, str]:
    """The largest scheduled minimum holding at `wall_s` or within `lead_s` of it, and why
    ("" and 0 when none does)."""
    best, why = 0, ""
    for entry in entries:
        now, soon = active(entry, wall_s), active(entry, wall_s + lead_s)
        if (now or soon) and entry.min_replicas > best:
            best = entry.min_replicas
            when = "" if now else f" (starting {lead_s:.0f}s ahead: expected cold start)"
            why = f"schedule {','.join(entry.days)} {entry.start}-{entry.end} {entry.tz}{when}"
    return best, why
