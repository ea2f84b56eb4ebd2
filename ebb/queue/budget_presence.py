"""Which subjects have a budget, and the version of that answer: what a frontdoor needs to
skip the reserve script for callers without one (ebb.frontdoor.budget_presence).

The version (`keys.BUDGETS_VERSION`) is bumped by lua/budget_set.lua in the script that
sets or removes a budget, so a reader that saw version N and reads N again knows nothing
changed since it read the subjects that went with N.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.replies import reply_text, reply_texts


class BudgetPresenceReads:
    def __init__(self, client: aioredis.Redis):
        self._redis = client

    async def version(self) -> int:
        raw = await self._redis.get(keys.BUDGETS_VERSION)
        return 0 if raw is None else int(reply_text(raw))

    async def subjects(self) -> tuple[int, frozenset[str]]:
        """The version and every subject with a budget, read together (one MULTI): the
        subjects are those of that version or a later one, never an earlier one."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.get(keys.BUDGETS_VERSION)
        pipe.hkeys(keys.BUDGETS)
        raw_version, names = await pipe.execute()
        version = 0 if raw_version is None else int(reply_text(raw_version))
        return version, frozenset(reply_texts(names))
