"""The platform's records as a `ScalingSource`: each runner's load from its last stats
(`RunnerStats`: requests in its batch, NVML's utilisation of its GPUs), finished
requests' time to first token and per output token from the usage stream, the
deployment's measured cold starts."""

from __future__ import annotations

import time
from collections.abc import Callable

from ebb.coldstart.scaling_tracker import Latency, RunnerLoad
from ebb.queue.observations import ObservationReader
from ebb.queue.platform import PlatformState

# Usage records read per reconcile at most: a burst's backlog is read over a few passes.
_BATCH = 10_000
# A deployment's cold-start averages are re-read at most this often: they move only when
# a start ends, and every deployment is measured every reconcile (the default hybrid
# keep-alive needs it), so a read each time would be a round trip per deployment per
# second for figures that seldom change.
COLD_STARTS_READ_EVERY_S = 10.0


class RedisScalingSource:
    def __init__(self, state: PlatformState, clock: Callable[[], float] = time.monotonic):
        self._state = state
        self._stats = ObservationReader(state.redis)
        self._clock = clock
        self._cold_starts: dict[str, tuple[float, dict[str, dict[str, float]]]] = {}

    async def runner_load(self, runner_ids: list[str]) -> dict[str, RunnerLoad]:
        loads = {}
        for stats in await self._stats.runner_stats(runner_ids):
            gpus = [g.utilization_pct for g in stats.gpus]
            gpu_pct = sum(gpus) / len(gpus) if gpus else None
            loads[stats.runner_id] = RunnerLoad(stats.batch_size, gpu_pct)
        return loads

    async def latencies_after(self, cursor: bytes) -> tuple[bytes, list[Latency]]:
        """From now on at first (b""): the history before this controller is not read."""
        after = cursor or f"{int(time.time() * 1000)}-0".encode()
        after, records = await self._state.usage_after(after, count=_BATCH)
        latencies = [
            Latency(
                r.deployment,
                r.finished_at_s,
                r.ttft_ms / 1000 if r.ttft_ms is not None else None,
                r.tpot_ms / 1000 if r.tpot_ms is not None else None,
                prompt_tokens=r.prompt_tokens,
                completion_tokens=r.completion_tokens,
                queue_s=r.queue_ms / 1000 if r.queue_ms is not None else None,
                batch_size=r.batch_size,
            )
            for r in records
            if r.state == "finished"
        ]
        return after, latencies

    async def cold_start_ms(self, deployment: str) -> dict[str, dict[str, float]]:
        now = self._clock()
        read = self._cold_starts.get(deployment)
        if read is None or now - read[0] >= COLD_STARTS_READ_EVERY_S:
            if read is None:
                self._forget_unasked(now)
            read = (now, await self._state.cold_start_ms(deployment))
            self._cold_starts[deployment] = read
        return read[1]

    def _forget_unasked(self, now: float) -> None:
        """Drop deployments not asked about for a while (deleted ones): asked about every
        reconcile, a served deployment's entry is never that old."""
        stale = now - 6 * COLD_STARTS_READ_EVERY_S
        for name in [d for d, (at, _) in self._cold_starts.items() if at < stale]:
            del self._cold_starts[name]
