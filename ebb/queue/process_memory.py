"""Every platform process's memory, as each one reports it (for `ebb status`).

Each process (frontdoors, controller, webhooks and billing workers, runners and stems,
and `ebb up` for the processes it started: redis-server, and the controller for its
fork server) writes its RSS and PSS here every few seconds under its own expiring key,
so the view covers processes on every host and a process that died drops out by itself.
"""

from __future__ import annotations

import msgspec
import redis
import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.replies import reply_texts


class ProcessMemory(msgspec.Struct, frozen=True):
    role: str  # frontdoor, coldstart, webhooks, billing, runner, fork-server, redis, up
    host: str
    pid: int
    rss_bytes: int
    pss_bytes: int | None  # None where the kernel gives no smaps_rollup
    reported_ms: int
    runner_id: str = ""  # for runners and stems

    @property
    def process_id(self) -> str:
        return f"{self.host}:{self.pid}"


def report_process_memory(client: redis.Redis, records: list[ProcessMemory]) -> None:
    """Publish `records` (one round trip); each expires unless reported again."""
    if not records:
        return
    pipe = client.pipeline(transaction=False)
    for record in records:
        pipe.set(
            keys.process_memory(record.process_id),
            msgspec.json.encode(record),
            ex=keys.PROCESS_MEMORY_TTL_S,
        )
        pipe.zadd(keys.PROCESSES, {record.process_id: record.reported_ms})
    pipe.execute()


async def read_process_memory(client: aioredis.Redis) -> list[ProcessMemory]:
    """Every process's last report, by role then host and pid; expired ones are dropped
    from the index on the way."""
    ids = reply_texts(await client.zrange(keys.PROCESSES, 0, -1))
    if not ids:
        return []
    raw = await client.mget([keys.process_memory(i) for i in ids])
    gone = [i for i, value in zip(ids, raw, strict=True) if value is None]
    if gone:
        await client.zrem(keys.PROCESSES, *gone)
    records = [msgspec.json.decode(v, type=ProcessMemory) for v in raw if v is not None]
    return sorted(records, key=lambda r: (r.role, r.host, r.pid))
