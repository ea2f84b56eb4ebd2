"""This frontdoor process's heartbeat: while it runs, its key (keys.frontdoor_alive) is
renewed every third of its TTL, so the controller's budget reaper can tell a dead
frontdoor's reservations (its key expired) from a live one's."""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.budget_holds import beat_frontdoor
from ebb.queue.connection import UNAVAILABLE_ERRORS

log = logging.getLogger(__name__)


async def keep_alive(client: aioredis.Redis, instance: str) -> None:
    """Renew `instance`'s key until cancelled; rides Redis outages out."""
    period_s = keys.FRONTDOOR_ALIVE_TTL_S / 3
    while True:
        try:
            await beat_frontdoor(client, instance)
        except UNAVAILABLE_ERRORS:
            log.warning("frontdoor: Redis unreachable; heartbeat retried in %.1f s", period_s)
        await asyncio.sleep(period_s)
