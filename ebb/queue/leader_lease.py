"""The controller's leader lease in Redis: one holder at a time, renewed or lost.

`LeaderLease` is what `ebb.coldstart.leader.LeaderElection` holds; each call is one Lua
script (lua/leader_hold.lua, lua/leader_release.lua), so acquiring, renewing and releasing
are atomic against every other controller. Expiry runs on the Redis clock.
"""

from __future__ import annotations

from typing import NamedTuple

import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.replies import reply_bytes, reply_int, reply_list
from ebb.queue.scripts import register_async


class Hold(NamedTuple):
    held: bool  # the caller holds the lease for the ttl it asked, counted from the call
    term: int  # the term the caller leads when held, else the current holder's


class LeaderLease:
    def __init__(self, client: aioredis.Redis):
        self._client = client
        self._hold = register_async(client, "leader_hold")
        self._release = register_async(client, "leader_release")

    async def hold(self, holder: str, ttl_ms: int) -> Hold:
        """Acquire the lease if it is free, renew it if `holder` has it; refused otherwise."""
        reply = reply_list(
            await self._hold(
                keys=[keys.CONTROLLER_LEADER, keys.CONTROLLER_TERM], args=[holder, ttl_ms]
            )
        )
        return Hold(bool(reply_int(reply[0])), reply_int(reply[1]))

    async def release(self, holder: str) -> bool:
        """Give the lease up at once (a clean shutdown), if `holder` still has it."""
        return bool(reply_int(await self._release(keys=[keys.CONTROLLER_LEADER], args=[holder])))

    async def holder(self) -> str | None:
        """Who holds the lease now (for status and tests)."""
        raw = await self._client.get(keys.CONTROLLER_LEADER)
        return None if raw is None else reply_bytes(raw).decode()
