"""Time as the controller sees it: a monotonic clock for intervals and a wall clock for
the timestamps it writes into records.

The platform runs on `SYSTEM_CLOCK`; a simulation or a test hands the controller a
`ManualClock` and moves it forward itself, so nothing sleeps for real.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Contract: `monotonic` never goes backwards and is only compared with itself;
    `time` is seconds since the epoch, the unit of every `*_ms` field divided by 1000."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


SYSTEM_CLOCK = SystemClock()


class ManualClock:
    """Simulated time: both clocks read `now_s`, which only `advance_to` moves, from an
    epoch of `wall_start_s` (so wall timestamps look like real ones)."""

    def __init__(self, *, wall_start_s: float = 1_700_000_000.0):
        self.now_s = 0.0
        self._wall_start_s = wall_start_s

    def advance_to(self, now_s: float) -> None:
        if now_s < self.now_s:
            raise ValueError(f"time goes forward only ({now_s} < {self.now_s})")
        self.now_s = now_s

    def advance(self, seconds: float) -> None:
        self.advance_to(self.now_s + seconds)

    def monotonic(self) -> float:
        return self.now_s

    def time(self) -> float:
        return self._wall_start_s + self.now_s

    def seconds_at(self, wall_ms: int) -> float:
        """The simulated time of a wall timestamp written by `ms`."""
        return wall_ms / 1000 - self._wall_start_s

    def ms(self, at_s: float | None = None) -> int:
        """The wall timestamp (ms) of simulated time `at_s` (default: now)."""
        return int((self._wall_start_s + (self.now_s if at_s is None else at_s)) * 1000)
