"""How the weight cache fetches and how much disk it may use: one object, passed down.

Built from `Settings` by the processes that call `ensure()` (frontdoor, runner, `ebb up`);
the defaults are what a library caller gets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ebb.config import Settings

MIB = 1024 * 1024


@dataclass(frozen=True)
class CacheOptions:
    # Least-recently-used entries are evicted to stay under this; None means no limit.
    budget_bytes: int | None = None
    # Parallel ranged GETs (across files and within large ones) per fetch.
    concurrency: int = 8
    # Objects larger than this are fetched as ranges of this size; each range is also the
    # unit of resume after an interrupted download.
    part_bytes: int = 16 * MIB
    # Attempts per request on transient errors (5xx, throttling, resets, timeouts).
    attempts: int = 5
    # The first retry waits about this long; each next one twice as long, with jitter.
    backoff_s: float = 0.5

    @classmethod
    def from_settings(cls, settings: Settings) -> CacheOptions:
        return cls(
            budget_bytes=settings.weights_cache_bytes,
            concurrency=settings.weights_fetch_concurrency,
            part_bytes=settings.weights_fetch_part_bytes,
            attempts=settings.weights_fetch_attempts,
        )
