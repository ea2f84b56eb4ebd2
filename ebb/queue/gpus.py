"""GPU inventories and runners' placements in Redis.

The controller writes each host's inventory (`HostInventory`, from NVML) and, before it
launches or assigns a runner, the devices it reserved for it (`GpuPlacement`); the runner
reads its placement when it loads, the frontdoor reads inventories for `GET /v1/status`
and to validate engine options. A placement is dropped when its runner is forgotten.
"""

from __future__ import annotations

import msgspec
import redis
import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.gpu_records import GpuPlacement, HostInventory
from ebb.queue.replies import reply_hash

# What a sleeper finds on its assignment list instead of a deployment when it must exit
# (no deployment is named "-": names start with a letter or digit).
SLEEPER_EXIT = "-"

_inventory = msgspec.json.Decoder(HostInventory)
_placement = msgspec.json.Decoder(GpuPlacement)


class GpuState:
    def __init__(self, client: aioredis.Redis):
        self.redis = client

    async def put_inventory(self, inventory: HostInventory) -> None:
        await self.redis.hset(keys.GPU_INVENTORY, inventory.host, msgspec.json.encode(inventory))

    async def inventories(self) -> list[HostInventory]:
        raw = reply_hash(await self.redis.hgetall(keys.GPU_INVENTORY))
        return sorted((_inventory.decode(v) for v in raw.values()), key=lambda i: i.host)

    async def put_placement(self, runner_id: str, placement: GpuPlacement) -> None:
        await self.redis.hset(keys.GPU_PLACEMENTS, runner_id, msgspec.json.encode(placement))

    async def placements(self) -> dict[str, GpuPlacement]:
        raw = reply_hash(await self.redis.hgetall(keys.GPU_PLACEMENTS))
        return {k.decode(): _placement.decode(v) for k, v in raw.items()}

    async def drop_placement(self, runner_id: str) -> None:
        await self.redis.hdel(keys.GPU_PLACEMENTS, runner_id)

    async def return_sleeper(self, runner_id: str, deployment: str) -> None:
        """Put back a sleeper taken but not woken (its device has no room for it now)."""
        await self.redis.sadd(keys.sleepers(deployment), runner_id)

    async def evict_sleeper(self, runner_id: str, deployment: str) -> bool:
        """Make a sleeping runner exit instead of ever being woken; False when it was
        already taken (woken) or left on its own. The SREM decides, as SPOP does for
        `take_sleeper`: whichever removes it from the set owns it."""
        if not await self.redis.srem(keys.sleepers(deployment), runner_id):
            return False
        await self.redis.rpush(keys.runner_assignment(runner_id), SLEEPER_EXIT)
        return True


def read_placement(client: redis.Redis, runner_id: str) -> GpuPlacement | None:
    """The placement the controller reserved for `runner_id` (a runner's own, at load)."""
    raw = client.hget(keys.GPU_PLACEMENTS, runner_id)
    return _placement.decode(raw) if isinstance(raw, bytes) else None
