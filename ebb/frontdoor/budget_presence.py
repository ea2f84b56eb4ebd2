"""Whether any budget applies to a caller, known without a round trip for most requests.

Most callers have no budget, and asking `budget_reserve.lua` for each of their requests
only to hear "none" costs the frontdoor a script call per request. This process keeps
the set of subjects that have a budget, with the version it was read at
(ebb.queue.budget_presence): a request whose key and tenant are both absent from it skips
the script. The set is trusted for `FRESH_S` after the read that confirmed it began; then
the next request reads the version again (one GET) and, only if it changed, the subjects.

The bound: a budget set or raised from nothing at time T is applied, on every frontdoor,
to every request admitted after T + FRESH_S (1 s); on the frontdoor that served the PUT,
at once. Requests admitted before then ran uncapped, as they would have had the budget
been set a second later.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ebb.queue.budget_presence import BudgetPresenceReads

FRESH_S = 1.0


class BudgetPresence:
    def __init__(self, reads: BudgetPresenceReads, clock: Callable[[], float] = time.monotonic):
        self._reads = reads
        self._clock = clock
        self._version = -1
        self._subjects: frozenset[str] = frozenset()
        self._confirmed_at = float("-inf")  # when the read that confirmed them began
        self._refreshing = asyncio.Lock()

    async def applies(self, key_subject: str, tenant_subject: str) -> bool:
        """Whether the key or the tenant may have a budget (then reserve; else skip)."""
        if self._clock() - self._confirmed_at >= FRESH_S:
            await self._refresh()
        return key_subject in self._subjects or tenant_subject in self._subjects

    def forget(self) -> None:
        """A budget was just set through this frontdoor: confirm before the next request."""
        self._confirmed_at = float("-inf")

    async def _refresh(self) -> None:
        async with self._refreshing:
            began = self._clock()
            if began - self._confirmed_at < FRESH_S:
                return  # another request refreshed while this one waited
            if await self._reads.version() != self._version:
                self._version, self._subjects = await self._reads.subjects()
            self._confirmed_at = began
