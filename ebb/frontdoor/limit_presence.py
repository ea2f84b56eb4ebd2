"""Which callers have rate limits at all, cached briefly: most keys and tenants have
none, and for them `ratelimit.lua` only answers "none" — a Redis round trip on every
admission (about a tenth of the frontdoor's CPU for an admitted request) to learn nothing.

A caller's answer serves its next requests for `_FRESH_S`, as a priority class does
(`ebb.frontdoor.priority`): a limit set through another frontdoor applies here within
that, and one set through this frontdoor's store at once (`RateLimitStore.changes`).
Callers with a limit always go through the script, which alone decides, atomically.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ebb.queue.ratelimits import RateLimitStore

_FRESH_S = 1.0
_KEPT = 4096  # callers remembered; bounded, since callers come and go


class LimitPresence:
    def __init__(self, store: RateLimitStore, clock: Callable[[], float] = time.monotonic):
        self._store = store
        self._clock = clock
        self._known: dict[tuple[str, str], tuple[float, bool]] = {}
        self._changes = store.changes

    async def limited(self, key_id: str, tenant: str) -> bool:
        """Whether the key `key_id` or its tenant has a limit (as read within `_FRESH_S`)."""
        if self._changes != self._store.changes:  # set through this frontdoor: read again
            self._changes = self._store.changes
            self._known.clear()
        caller = (key_id, tenant)
        now = self._clock()
        known = self._known.get(caller)
        if known is not None and now - known[0] < _FRESH_S:
            return known[1]
        limited = await self._store.any_limit(key_id, tenant)
        if len(self._known) >= _KEPT:
            self._known.clear()
        self._known[caller] = (now, limited)
        return limited
