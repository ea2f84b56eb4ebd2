"""Whether Redis has room for a new tenant-fed write, read from INFO memory.

Redis runs with `maxmemory` and `noeviction` (ebb.redis_server): past the limit every
write fails, the platform's own included. Tenant-fed stores (stored responses, stream
views, and any other store a tenant fills) ask `tenant_write_allowed` first and are
refused past a high-water mark below the limit, which keeps the rest for platform state.
The reading is cached for a second: one INFO per frontdoor per second, whatever the load.
A Redis without `maxmemory` (an external one left unbounded) refuses nothing.
"""

from __future__ import annotations

import time

import msgspec
import redis.asyncio as aioredis

# How long one INFO memory reading answers for.
CACHE_S = 1.0


class MemoryReading(msgspec.Struct, frozen=True):
    used_memory_bytes: int
    maxmemory_bytes: int  # 0: no limit
    high_water_bytes: int  # 0: no mark (no limit)

    @property
    def tenant_write_allowed(self) -> bool:
        return self.high_water_bytes == 0 or self.used_memory_bytes < self.high_water_bytes


class RedisHeadroom:
    def __init__(self, client: aioredis.Redis, *, high_water: float, cache_s: float = CACHE_S):
        """`high_water`: the share of `maxmemory` past which tenant writes are refused."""
        self._redis = client
        self._high_water = high_water
        self._cache_s = cache_s
        self._reading: MemoryReading | None = None
        self._read_at_s = 0.0

    async def reading(self) -> MemoryReading:
        """Redis's memory as of at most `cache_s` ago."""
        now_s = time.monotonic()
        if self._reading is None or now_s - self._read_at_s >= self._cache_s:
            info = await self._redis.info("memory")
            limit = int(info.get("maxmemory", 0))
            self._reading = MemoryReading(
                used_memory_bytes=int(info.get("used_memory", 0)),
                maxmemory_bytes=limit,
                high_water_bytes=int(limit * self._high_water),
            )
            self._read_at_s = now_s
        return self._reading

    async def tenant_write_allowed(self) -> bool:
        """False once Redis's memory passed the high-water mark."""
        return (await self.reading()).tenant_write_allowed
