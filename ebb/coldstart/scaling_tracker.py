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
from typing import Protocol, TypeVar, runtime_checkable

from ebb.coldstart.estimate import tier_estimate_s
from ebb.coldstart.keepalive import percentile
from ebb.coldstart.latency_model import LatencyModel, Sample
from ebb.coldstart.scaling_actions import Scaled
from ebb.coldstart.scaling_inputs import Measured
from ebb.launching.tiers import Tier
from ebb.queue.scaling_spec import QUEUE_ONLY
from ebb.queue.schema import DeploymentSpec
from ebb.queue.versions import public_name

# One utilisation sample per this long: a 30-minute window is 180 samples.
SAMPLE_EVERY_S = 10.0
# Idle periods remembered per deployment (the keep-alive histogram's history).
PERIODS_KEPT = 1000
# A hold (a policy's move not made) repeated is logged again after this long.
HOLD_LOGGED_EVERY_S = 60.0
# The recent peak of requests held at once is over this long.
PEAK_WINDOW_S = 30.0
# Idle periods remembered per level of need, and the trend predictor's samples.
LEVEL_PERIODS_KEPT = 500
TREND_SAMPLE_S = 1.0
TREND_WINDOW_S = 20.0
A = TypeVar("A")


@dataclass(frozen=True)
class Latency:
    deployment: str
    finished_s: float  # wall clock
    ttft_s: float | None
    tpot_s: float | None = None
    # For the latency model (None: not reported, e.g. by an older runner).
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    queue_s: float | None = None
    batch_size: float | None = None

    def sample(self) -> Sample:
        return Sample(
            self.finished_s,
            self.prompt_tokens,
            self.completion_tokens,
            self.ttft_s,
            self.queue_s,
            self.tpot_s,
            self.batch_size,
        )


@dataclass(frozen=True)
class RunnerLoad:
    held: int  # requests it holds
    gpu_pct: float | None = None  # NVML's utilisation of its GPUs (None: on CPU)


@runtime_checkable
class ScalingSource(Protocol):
    """Where the measurements come from (Redis: `scaling_reads.RedisScalingSource`)."""

    async def runner_load(self, runner_ids: list[str]) -> dict[str, RunnerLoad]:
        """How loaded each runner is now (absent: unknown, taken as idle)."""
        ...

    async def latencies_after(self, cursor: bytes) -> tuple[bytes, list[Latency]]:
        """Requests finished after `cursor` (b"": from now on), and the next cursor."""
        ...

    async def cold_start_ms(self, deployment: str) -> dict[str, dict[str, float]]: ...


@dataclass
class _Levels:
    """Each level of need's idle periods and since when it has been idle."""

    since_s: dict[int, float] = field(default_factory=dict)
    periods_s: dict[int, deque[float]] = field(default_factory=dict)
    frozen: tuple[tuple[float, ...], ...] = ()  # `periods_s` as Measured carries it

    def track(self, need: int, top: int, wall_s: float) -> tuple[float, ...]:
        """Take in the need now (levels 1..`top`); returns each level's idle time."""
        changed = False
        for k in range(1, top + 1):
            since = self.since_s.get(k)
            if need >= k and since is not None:
                kept = self.periods_s.setdefault(k, deque(maxlen=LEVEL_PERIODS_KEPT))
                kept.append(wall_s - since)
                del self.since_s[k]
                changed = True
            elif need < k and since is None:
                self.since_s[k] = wall_s
        if changed or len(self.frozen) != top:
            self.frozen = tuple(tuple(self.periods_s.get(k, ())) for k in range(1, top + 1))
        return tuple(_since(self.since_s.get(k), wall_s) for k in range(1, top + 1))


@dataclass
class _Memory:
    latencies: deque[tuple[float, float | None, float | None]] = field(default_factory=deque)
    utilisation: deque[tuple[float, float]] = field(default_factory=deque)
    idle_since_s: dict[str, float] = field(default_factory=dict)  # per runner
    periods_s: deque[float] = field(default_factory=lambda: deque(maxlen=PERIODS_KEPT))
    deployment_idle_since_s: float | None = None
    peaks: deque[tuple[float, int]] = field(default_factory=deque)  # (when, held)
    levels: _Levels = field(default_factory=lambda: _Levels())
    demand: deque[tuple[float, float]] = field(default_factory=deque)
    last_out_s: float = -math.inf
    last_in_s: float = -math.inf
    hold_logged: tuple[object, ...] = ()
    hold_logged_s: float = -math.inf
    model: LatencyModel = field(default_factory=LatencyModel)
    # Only a latency target reads finished requests (`read_latencies`): the default block
    # (the hybrid keep-alive) needs none, and reading every finished request of every
    # deployment would cost the controller CPU and memory for nothing.
    keeps_latencies: bool = False


class ScalingTracker:
    def __init__(self, source: ScalingSource | None):
        self._source = source
        self._memory: dict[str, _Memory] = {}
        self._cursor = b""

    def tracks(self, spec: DeploymentSpec) -> bool:
        return self._source is not None and spec.scaling != QUEUE_ONLY

    async def read_latencies(self, units: Sequence[str]) -> None:
        """Take in what finished since the last reconcile (once per reconcile), and forget
        the deployments no longer among `units` (the serving units now)."""
        for gone in set(self._memory) - set(units):
            del self._memory[gone]
        keeping = {u: m for u, m in self._memory.items() if m.keeps_latencies}
        if self._source is None or not keeping:
            self._cursor = b""  # read from then on once a target asks again
            return
        self._cursor, finished = await self._source.latencies_after(self._cursor)
        # Usage records name the deployment, not the version: a rollout's two units
        # share what either served.
        by_public: dict[str, list[_Memory]] = {}
        for unit, memory in keeping.items():
            by_public.setdefault(public_name(unit), []).append(memory)
        for done in finished:
            for memory in by_public.get(done.deployment, []):
                memory.latencies.append((done.finished_s, done.ttft_s, done.tpot_s))
                memory.model.observe([done.sample()])

    async def measure(
        self, spec: DeploymentSpec, ready: Sequence[str], wall_s: float, queued: int = 0
    ) -> tuple[Measured, float]:
        """What `spec`'s policies see now (`queued`: requests and jobs waiting), and its
        expected (slowest tier) cold start."""
        assert self._source is not None
        memory = self._memory.setdefault(spec.name, _Memory())
        memory.keeps_latencies = spec.scaling.slo is not None
        if not memory.keeps_latencies:
            memory.latencies.clear()
        loads = await self._source.runner_load(list(ready))
        held = {r: load.held for r, load in loads.items()}
        self._track_idle(memory, held, ready, wall_s)
        self._track_deployment(memory, sum(held.values()), queued, wall_s)
        self._sample(memory, spec, [loads.get(r, RunnerLoad(0)) for r in ready], wall_s)
        demand = sum(held.values()) + queued
        need = math.ceil(demand / max(spec.max_concurrency, 1))
        level_idle_s = memory.levels.track(need, spec.max_replicas, wall_s)
        if not memory.demand or wall_s - memory.demand[-1][0] >= TREND_SAMPLE_S:
            memory.demand.append((wall_s, float(demand)))
        while memory.demand and memory.demand[0][0] < wall_s - TREND_WINDOW_S:
            memory.demand.popleft()
        cold_starts_ms = await self._source.cold_start_ms(spec.name)
        cold = tier_estimate_s(cold_starts_ms, Tier.FRESH)
        slo = spec.scaling.slo
        window_s = slo.window_s if slo else 60.0
        while memory.latencies and memory.latencies[0][0] < wall_s - window_s:
            memory.latencies.popleft()
        ttfts = [t for _, t, _ in memory.latencies if t is not None]
        tpots = [t for _, _, t in memory.latencies if t is not None]
        measured = Measured(
            ttft_p90_s=percentile(ttfts, 90) if ttfts else None,
            tpot_p90_s=percentile(tpots, 90) if tpots else None,
            utilisation=tuple(memory.utilisation),
            idle_periods_s=tuple(memory.periods_s),
            idle_s=_since(memory.deployment_idle_since_s, wall_s),
            peak_held=max((n for _, n in memory.peaks), default=0),
            held=held,
            idle_for_s={r: wall_s - s for r, s in memory.idle_since_s.items()},
            level_periods_s=memory.levels.frozen,
            level_idle_s=level_idle_s,
            demand=tuple(memory.demand),
            cold_starts_s={
                t.value: tier_estimate_s(cold_starts_ms, t) for t in Tier if t in cold_starts_ms
            },
            last_out_s=memory.last_out_s,
            last_in_s=memory.last_in_s,
            latency_fit=memory.model.fit(wall_s) if slo is not None and slo.predict else None,
        )
        return measured, cold

    def after_plan(self, actions: list[A], wall_s: float) -> list[A]:
        """Remember the policies' moves, for the reversal gap; returns `actions` less a
        decision that only repeats a hold logged within `HOLD_LOGGED_EVERY_S` (a target
        broken for minutes is one line a minute in the log, not one a reconcile)."""
        kept: list[A] = []
        for action in actions:
            if isinstance(action, Scaled):
                memory = self._memory.setdefault(action.deployment, _Memory())
                if action.direction > 0:
                    memory.last_out_s = wall_s
                elif action.direction < 0:
                    memory.last_in_s = wall_s
                elif self._repeats_hold(memory, action, wall_s):
                    continue
            kept.append(action)
        return kept

    @staticmethod
    def _repeats_hold(memory: _Memory, action: Scaled, wall_s: float) -> bool:
        key = (action.policy, action.desired, tuple(r.split(" ")[0] for r in action.reasons))
        if memory.hold_logged == key and wall_s - memory.hold_logged_s < HOLD_LOGGED_EVERY_S:
            return True
        memory.hold_logged, memory.hold_logged_s = key, wall_s
        return False

    @staticmethod
    def _track_idle(
        memory: _Memory, held: dict[str, int], ready: Sequence[str], wall_s: float
    ) -> None:
        """Since when each ready runner has held nothing."""
        for runner_id in list(memory.idle_since_s):
            if runner_id not in ready or held.get(runner_id, 0) > 0:
                del memory.idle_since_s[runner_id]
        for runner_id in ready:
            if held.get(runner_id, 0) == 0:
                memory.idle_since_s.setdefault(runner_id, wall_s)

    @staticmethod
    def _track_deployment(memory: _Memory, held: int, queued: int, wall_s: float) -> None:
        """The deployment's idle periods: from holding and queueing nothing to its next
        request (seen queued, or held by a runner); and its recent peak."""
        busy = held + queued > 0
        since = memory.deployment_idle_since_s
        if busy and since is not None:
            memory.periods_s.append(wall_s - since)
            memory.deployment_idle_since_s = None
        elif not busy and since is None:
            memory.deployment_idle_since_s = wall_s
        memory.peaks.append((wall_s, held + queued))
        while memory.peaks and memory.peaks[0][0] < wall_s - PEAK_WINDOW_S:
            memory.peaks.popleft()

    @staticmethod
    def _sample(
        memory: _Memory, spec: DeploymentSpec, loads: list[RunnerLoad], wall_s: float
    ) -> None:
        """Utilisation: NVML's on a runner with GPUs, its busy-slot share on CPU; the
        mean over the ready runners (0 with none: nothing to keep busy)."""
        if memory.utilisation and wall_s - memory.utilisation[-1][0] < SAMPLE_EVERY_S:
            return
        shares = [
            load.gpu_pct / 100
            if load.gpu_pct is not None
            else load.held / max(spec.max_concurrency, 1)
            for load in loads
        ]
        share = sum(shares) / len(shares) if shares else 0.0
        memory.utilisation.append((wall_s, min(1.0, share)))
        rule = spec.scaling.utilisation
        keep_s = max(rule.up_for_s, rule.down_for_s) + SAMPLE_EVERY_S
        while memory.utilisation and memory.utilisation[0][0] < wall_s - keep_s:
            memory.utilisation.popleft()


def _since(start_s: float | None, wall_s: float) -> float:
    return 0.0 if start_s is None else wall_s - start_s
