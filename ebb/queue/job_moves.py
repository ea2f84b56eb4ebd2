"""Moving the jobs queued for a version that stopped serving to the version that serves.

A job's attempt is queued for the version the traffic split picked when it was queued
(`job_scripts.job_submit`). When that version's share drops to 0 (a rollout finished, a
rollback, a deleted version), what still waits in its job queue would wait for a version
that no longer scales up for traffic; the controller moves it (`job_move.lua`, one
atomic step per chunk, each attempt only while it is still queued).
"""

from __future__ import annotations

import msgspec
import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.replies import reply_int, reply_texts
from ebb.queue.schema import decode_work, encode
from ebb.queue.scripts import Arg, register_async

# Attempts moved per script call: a call is one atomic step that blocks Redis meanwhile.
_CHUNK = 200
# At most this many are moved per call of `move_queued`; the controller's next pass
# moves the rest.
_MAX_PER_CALL = 10_000


class JobMoves:
    def __init__(self, client: aioredis.Redis):
        self.redis = client
        self._move = register_async(client, "job_move")

    async def queued(self, units: list[str]) -> list[int]:
        """How many job attempts wait in each of `units`' job queues, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for unit in units:
            pipe.zcard(keys.job_queue(unit))
        return [reply_int(n) for n in await pipe.execute()]

    async def move_queued(self, from_unit: str, to_unit: str) -> int:
        """Move the attempts waiting in `from_unit`'s job queue to `to_unit`'s, oldest
        first and keeping their order; how many moved."""
        ids = reply_texts(await self.redis.zrange(keys.job_queue(from_unit), 0, _MAX_PER_CALL - 1))
        moved = 0
        for start in range(0, len(ids), _CHUNK):
            moved += await self._move_chunk(ids[start : start + _CHUNK], from_unit, to_unit)
        return moved

    async def _move_chunk(self, ids: list[str], from_unit: str, to_unit: str) -> int:
        pipe = self.redis.pipeline(transaction=False)
        for request_id in ids:
            pipe.hget(keys.request(request_id), "work")
        works = await pipe.execute()
        request_keys: list[str] = []
        args: list[Arg] = [to_unit, keys.SIGNAL_LIST_MAX]
        for request_id, raw in zip(ids, works, strict=True):
            if not raw:
                continue  # settled and gone meanwhile
            work = msgspec.structs.replace(decode_work(raw), deployment=to_unit)
            request_keys.append(keys.request(request_id))
            args += [request_id, encode(work)]
        if not request_keys:
            return 0
        reply = await self._move(
            keys=[
                keys.job_queue(from_unit),
                keys.job_queue(to_unit),
                keys.queue_signal(to_unit),
                keys.WAKE,
                *request_keys,
            ],
            args=args,
        )
        return reply_int(reply)
