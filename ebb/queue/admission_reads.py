"""What admitting a request reads about its deployment, in as few Redis round trips as
routing allows.

Admission needs the deployment's record (who may call it), its traffic split (which
version serves), the chosen version's record (what that unit runs with), and that unit's
status and queue depth (a failing deployment or a full queue is refused before any
tokenizing). Read one after another those are four round trips on every request; here
they are one pipeline for version 1, which is every deployment without versions and the
one a split without a rollout sends everything to, and a second only when the split
picks another version (that version's unit is known only once the split is read).

Requests for one unit that arrive together share its read: a burst of a hundred requests
at one deployment is one round trip, decoded once, not a hundred. The read is sent only
after every request sharing it has arrived, so none of them acts on state older than its
own arrival (a deployment created just before a request is never a 404 for it).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.replies import reply_hash, reply_int
from ebb.queue.schema import DeploymentSpec
from ebb.queue.version_store import ask_unit, decode_split, decode_unit
from ebb.queue.versions import TrafficSplit, unit_name


@dataclass(frozen=True)
class UnitRead:
    """One serving unit of a deployment, read in one round trip.

    `spec`: the unit's composed spec (its name is the unit's), None when the deployment is
    gone or the version (other than 1) is. `split`: the deployment's traffic split as read
    in the same round trip. `status`: the unit's `deployment_status`; `depth`: requests
    waiting in its queue."""

    spec: DeploymentSpec | None
    split: TrafficSplit
    status: dict[str, str]
    depth: int


class AdmissionReads:
    def __init__(self, client: aioredis.Redis):
        self.redis = client
        # Reads created but not yet sent, by (deployment, version): a request for the same
        # unit joins one of these, never a read already on its way to Redis.
        self._gathering: dict[tuple[str, int], asyncio.Task[UnitRead]] = {}

    async def deployment(self, name: str) -> UnitRead:
        """The deployment `name` with its version 1's unit: what routing starts from, and
        all it needs when the split picks version 1."""
        return await self.unit(name, 1)

    async def unit(self, deployment: str, version: int) -> UnitRead:
        """One version's unit of `deployment` (the split is read again with it, so that
        the spec is composed from one moment's records), read once for every request that
        asks for it before the read is sent."""
        key = (deployment, version)
        read = self._gathering.get(key)
        if read is None:
            # A task's first step runs on the loop's next turn: requests arriving until
            # then join it, and it stops gathering them before it sends anything.
            read = asyncio.create_task(self._read_unit(key))
            self._gathering[key] = read
        # Shielded: one caller cancelled (its client gone) cancels no one else's read.
        return await asyncio.shield(read)

    async def _read_unit(self, key: tuple[str, int]) -> UnitRead:
        del self._gathering[key]
        deployment, version = key
        unit = unit_name(deployment, version)
        pipe = self.redis.pipeline(transaction=False)
        ask_unit(pipe, deployment, version)
        pipe.hgetall(keys.deployment_status(unit))
        pipe.zcard(keys.queue(unit))
        raw_spec, raw_version, raw_split, raw_status, raw_depth = await pipe.execute()
        return UnitRead(
            spec=decode_unit(raw_spec, raw_version, raw_split, version),
            split=decode_split(raw_split),
            status=_status(raw_status),
            depth=reply_int(raw_depth),
        )


def _status(raw: Any) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in reply_hash(raw).items()}
