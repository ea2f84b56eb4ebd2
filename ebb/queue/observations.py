"""Figures that processes other than the frontdoor contribute to /metrics, through Redis.

Two kinds: running totals any process adds to (jobs and webhook deliveries by outcome,
bytes of weights fetched), kept in one hash as `name|label|label` -> total, so they are
cumulative across processes and restarts; and each runner's latest engine figures (KV
cache, prefix cache, batch), a small record it renews every report and that expires with
it. Whichever process serves /metrics reads both at scrape time.
"""

from __future__ import annotations

import msgspec
import redis
import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.gpu_records import GpuDevice
from ebb.queue.metering import GpuSegment, decode_gpu_entry
from ebb.queue.replies import reply_bytes, reply_entries, reply_hash, reply_list
from ebb.queue.schema import UsageRecord

# Counter names (the `name` part of a field) in the shared counters hash.
JOBS = "jobs"  # labels: deployment, outcome
WEBHOOK_DELIVERIES = "webhook_deliveries"  # labels: outcome
WEIGHTS_FETCHED_BYTES = "weights_fetched_bytes"  # labels: source kind (s3, hf, gguf, ...)
ENGINE_STALLS = "engine_stalls"  # labels: deployment (runners killed by their watchdog)
ADAPTER_LOADS = "adapter_loads"  # labels: deployment (a LoRA adapter), base

# Stream entries read per scrape round trip.
_READ_BATCH = 1000


class RunnerStats(msgspec.Struct, kw_only=True, frozen=True):
    """A runner's engine figures at one moment; token counts are totals since it loaded."""

    runner_id: str
    deployment: str
    batch_size: int  # requests held in the engine's running batch
    kv_cache_usage_ratio: float | None = None  # None: the engine does not say
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    gpus: list[GpuDevice] = []  # its GPUs, as it last read them


_stats_decoder = msgspec.json.Decoder(RunnerStats)
_usage_decoder = msgspec.json.Decoder(UsageRecord)


def counter_field(name: str, labels: tuple[str, ...]) -> str:
    # "|" separates labels; a label holding one is folded so the split stays unambiguous.
    return "|".join((name, *(label.replace("|", "/") for label in labels)))


def count(client: redis.Redis, name: str, labels: tuple[str, ...], amount: float = 1) -> None:
    """Add `amount` to the shared counter `name{labels}` (blocking client)."""
    client.hincrbyfloat(keys.METRIC_COUNTERS, counter_field(name, labels), amount)


async def count_async(
    client: aioredis.Redis, name: str, labels: tuple[str, ...], amount: float = 1
) -> None:
    """Add `amount` to the shared counter `name{labels}` (asyncio client)."""
    await client.hincrbyfloat(keys.METRIC_COUNTERS, counter_field(name, labels), amount)


def report_runner_stats(client: redis.Redis, stats: RunnerStats) -> None:
    client.set(
        keys.runner_stats(stats.runner_id),
        msgspec.json.encode(stats),
        ex=keys.RUNNER_STATS_TTL_S,
    )


class ObservationReader:
    """What /metrics reads from Redis at scrape time."""

    def __init__(self, client: aioredis.Redis):
        self._redis = client

    async def counters(self) -> dict[str, list[tuple[tuple[str, ...], float]]]:
        """Every shared counter: name -> [(labels, total)]."""
        raw = reply_hash(await self._redis.hgetall(keys.METRIC_COUNTERS))
        result: dict[str, list[tuple[tuple[str, ...], float]]] = {}
        for field, value in raw.items():
            name, *labels = field.decode().split("|")
            result.setdefault(name, []).append((tuple(labels), float(value)))
        return result

    async def runner_stats(self, runner_ids: list[str]) -> list[RunnerStats]:
        if not runner_ids:
            return []
        values = await self._redis.mget([keys.runner_stats(r) for r in runner_ids])
        return [_stats_decoder.decode(reply_bytes(v)) for v in reply_list(values) if v is not None]

    async def gpu_segments_after(self, after_id: str) -> tuple[str, list[GpuSegment]]:
        """GPU-time segments on the GPU usage stream after `after_id`, and the last id."""
        last_id, entries = await self._entries_after(keys.GPU_USAGE, after_id)
        segments = []
        for fields in entries:
            try:
                entry = decode_gpu_entry(fields)
            except ValueError:
                continue
            if isinstance(entry, GpuSegment):
                segments.append(entry)
        return last_id, segments

    async def usage_after(self, after_id: str) -> tuple[str, list[UsageRecord]]:
        """Usage records of finished requests after `after_id`, and the last id."""
        last_id, entries = await self._entries_after(keys.USAGE, after_id)
        return last_id, [_usage_decoder.decode(f[b"r"]) for f in entries if b"r" in f]

    async def _entries_after(
        self, stream: str, after_id: str
    ) -> tuple[str, list[dict[bytes, bytes]]]:
        found: list[dict[bytes, bytes]] = []
        while True:
            reply = await self._redis.xrange(stream, min=f"({after_id}", count=_READ_BATCH)
            entries = reply_entries(reply)
            for entry_id, fields in entries:
                after_id = entry_id
                found.append(fields)
            if len(entries) < _READ_BATCH:
                return after_id, found

    async def webhook_backlog(self) -> int:
        """Webhook deliveries due or in flight (not yet delivered or given up)."""
        return int(await self._redis.zcard(keys.DELIVERIES_DUE))
