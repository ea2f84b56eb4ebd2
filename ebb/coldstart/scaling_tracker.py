"""The controller's memory for the scaling policies: what `Measured` carries, gathered
reconcile by reconcile from a `ScalingSource` (the platform's records; the simulator's),
and the last scale-out and scale-in of each deployment (for the reversal gap).

Only deployments with a non-default `scaling` block are measured: the default costs no
read. Kept in memory like the backoffs: a new leader starts measuring afresh (its
policies hold until their windows fill; the queue-only rule still starts runners).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ebb.coldstart.estimate import tier_estimate_s
from ebb.coldstart.keepalive import percentile
from ebb.coldstart.scaling_actions import Scaled
from ebb.coldstart.scaling_inputs import Measured
from ebb.launching.tiers import Tier
from ebb.queue.scaling_spec import ScalingSpec
from ebb.queue.schema import DeploymentSpec

# One utilisation sample per this long: a 30-minute window is 180 samples.
SAMPLE_EVERY_S = 10.0
# Idle periods remembered per deployment (the keep-alive histogram's history).
PERIODS_KEPT = 1000
DEFAULT = ScalingSpec()


@dataclass(frozen=True)
class Latency:
    deployment: str
    finished_s: float  # wall clock
    ttft_s: float | None
    tpot_s: float | None = None


@runtime_checkable
class ScalingSource(Protocol):
    """Where the measurements come from (Redis: `queue.scaling_reads`)."""

    async def runner_held(self, runner_ids: list[str]) -> dict[str, int]:
        """Requests each runner holds now (absent: unknown)."""
        ...

    async def latencies_after(self, cursor: bytes) -> tuple[bytes, list[Latency]]:
        """Requests finished after `cursor` (b"": from now on), and the next cursor."""
        ...

    async def cold_start_ms(self, deployment: str) -> dict[str, dict[str, float]]: ...


@dataclass
class _Memory:
    latencies: deque[tuple[float, float | None, float | None]] = field(default_factory=deque)
    utilisation: deque[tuple[float, float]] = field(default_factory=deque)
    idle_since_s: dict[str, float] = field(default_factory=dict)
    periods_s: deque[float] = field(default_factory=lambda: deque(maxlen=PERIODS_KEPT))
    last_out_s: float = -math.inf
    last_in_s: float = -math.inf


class ScalingTracker:
    def __init__(self, source: ScalingSource | None):
        self._source = source
        self._memory: dict[str, _Memory] = {}
        self._cursor = b""

    def tracks(self, spec: DeploymentSpec) -> bool:
        return self._source is not None and spec.scaling != DEFAULT

    async def read_latencies(self) -> None:
        """Take in what finished since the last reconcile (once per reconcile)."""
        if self._source is None or not self._memory:
            return
        self._cursor, finished = await self._source.latencies_after(self._cursor)
        for done in finished:
            memory = self._memory.get(done.deployment)
            if memory is not None:
                memory.latencies.append((done.finished_s, done.ttft_s, done.tpot_s))

    async def measure(
        self, spec: DeploymentSpec, ready: Sequence[str], wall_s: float
    ) -> tuple[Measured, float]:
        """What `spec`'s policies see now, and its expected (slowest tier) cold start."""
        assert self._source is not None
        memory = self._memory.setdefault(spec.name, _Memory())
        held = await self._source.runner_held(list(ready))
        self._track_idle(memory, held, ready, wall_s)
        self._sample(memory, spec, held, len(ready), wall_s)
        cold = tier_estimate_s(await self._source.cold_start_ms(spec.name), Tier.FRESH)
        window_s = spec.scaling.slo.window_s if spec.scaling.slo else 60.0
        while memory.latencies and memory.latencies[0][0] < wall_s - window_s:
            memory.latencies.popleft()
        ttfts = [t for _, t, _ in memory.latencies if t is not None]
        tpots = [t for _, _, t in memory.latencies if t is not None]
        measured = Measured(
            ttft_p90_s=percentile(ttfts, 90) if ttfts else None,
            tpot_p90_s=percentile(tpots, 90) if tpots else None,
            utilisation=tuple(memory.utilisation),
            idle_periods_s=tuple(memory.periods_s),
            held=held,
            idle_for_s={r: wall_s - s for r, s in memory.idle_since_s.items()},
            last_out_s=memory.last_out_s,
            last_in_s=memory.last_in_s,
        )
        return measured, cold

    def after_plan(self, actions: Sequence[object], wall_s: float) -> None:
        """Remember the policies' moves, for the reversal gap."""
        for action in actions:
            if isinstance(action, Scaled) and action.direction:
                memory = self._memory.setdefault(action.deployment, _Memory())
                if action.direction > 0:
                    memory.last_out_s = wall_s
                else:
                    memory.last_in_s = wall_s

    @staticmethod
    def _track_idle(
        memory: _Memory, held: dict[str, int], ready: Sequence[str], wall_s: float
    ) -> None:
        """An idle period ends when its runner holds a request again; one whose runner is
        gone ended unknown (inf)."""
        for runner_id in list(memory.idle_since_s):
            if runner_id not in ready:
                memory.periods_s.append(math.inf)
                del memory.idle_since_s[runner_id]
        for runner_id in ready:
            busy = held.get(runner_id, 0) > 0
            since = memory.idle_since_s.get(runner_id)
            if busy and since is not None:
                memory.periods_s.append(wall_s - since)
                del memory.idle_since_s[runner_id]
            elif not busy and since is None:
                memory.idle_since_s[runner_id] = wall_s

    @staticmethod
    def _sample(
        memory: _Memory, spec: DeploymentSpec, held: dict[str, int], ready: int, wall_s: float
    ) -> None:
        if memory.utilisation and wall_s - memory.utilisation[-1][0] < SAMPLE_EVERY_S:
            return
        slots = ready * spec.max_concurrency
        share = sum(held.values()) / slots if slots else 0.0
        memory.utilisation.append((wall_s, min(1.0, share)))
        rule = spec.scaling.utilisation
        keep_s = max(rule.up_for_s, rule.down_for_s) + SAMPLE_EVERY_S
        while memory.utilisation and memory.utilisation[0][0] < wall_s - keep_s:
            memory.utilisation.popleft()
