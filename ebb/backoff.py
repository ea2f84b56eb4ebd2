"""Doubling backoff, the one rule every retry and restart in ebb waits by.

A failure's n-th consecutive repeat (n from 1) waits `first_s * 2**(n-1)`, never more than
`cap_s`. Callers that many clients may hit at once (a shared store coming back) spread
their retries with `jittered`; restarts of one process do not need to.
"""

from __future__ import annotations

import random


def delay_s(failures: int, *, first_s: float, cap_s: float) -> float:
    """The wait after `failures` consecutive failures (0 or fewer: none yet, no wait)."""
    if failures <= 0:
        return 0.0
    # Past about 60 doublings the float overflows long after any cap applies.
    return min(cap_s, first_s * 2.0 ** min(failures - 1, 60))


def jittered(wait_s: float) -> float:
    """`wait_s` spread over its upper half, so that retries of many clients do not
    arrive together (and none waits less than half its backoff)."""
    return wait_s * random.uniform(0.5, 1.0)  # noqa: S311 - spreading load, not security
