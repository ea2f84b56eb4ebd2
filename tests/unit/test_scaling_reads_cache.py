"""The controller's cold-start reads: every deployment is measured every reconcile, so a
deployment's cold-start averages are read once per `COLD_STARTS_READ_EVERY_S`, not each
time."""

from __future__ import annotations

from typing import Any, cast

from ebb.coldstart.scaling_reads import COLD_STARTS_READ_EVERY_S, RedisScalingSource
from ebb.queue.platform import PlatformState


class CountingState:
    redis = None

    def __init__(self) -> None:
        self.reads: list[str] = []
        self.fresh_ms = 1000.0

    async def cold_start_ms(self, deployment: str) -> dict[str, dict[str, float]]:
        self.reads.append(deployment)
        return {"fresh": {"total": self.fresh_ms}}


def source(clock: list[float]) -> tuple[RedisScalingSource, CountingState]:
    state = CountingState()
    reads = RedisScalingSource(cast(PlatformState, cast(Any, state)), clock=lambda: clock[0])
    return reads, state


async def test_cold_starts_are_reread_once_per_interval_and_then_fresh() -> None:
    now = [100.0]
    reads, state = source(now)
    assert await reads.cold_start_ms("m") == {"fresh": {"total": 1000.0}}
    state.fresh_ms = 2000.0
    now[0] += COLD_STARTS_READ_EVERY_S - 0.5
    assert await reads.cold_start_ms("m") == {"fresh": {"total": 1000.0}}  # within: kept
    assert state.reads == ["m"]
    now[0] += 0.5
    assert await reads.cold_start_ms("m") == {"fresh": {"total": 2000.0}}  # due: re-read
    assert await reads.cold_start_ms("other") == {"fresh": {"total": 2000.0}}
    assert state.reads == ["m", "m", "other"]


async def test_a_deployment_no_longer_asked_about_is_forgotten() -> None:
    now = [0.0]
    reads, state = source(now)
    await reads.cold_start_ms("deleted")
    for _ in range(8):  # a served deployment, asked about every reconcile for 80 s
        now[0] += COLD_STARTS_READ_EVERY_S
        await reads.cold_start_ms("served")
    await reads.cold_start_ms("new")  # a first read prunes what went unasked
    assert await reads.cold_start_ms("deleted") == {"fresh": {"total": 1000.0}}
    assert state.reads.count("deleted") == 2, "read again: it had been forgotten"
    assert state.reads.count("served") == 8
