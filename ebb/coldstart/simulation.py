"""Replay a request trace through the platform's autoscaling on a simulated clock.

What a deployment's traffic would meet under its scaling settings (how long requests
wait, how many are refused at the admission window and with what `Retry-After`, how many
runner-seconds it costs) without starting a process. The decisions are the platform's
own code, not a model of it: the real `Controller` (its policy, tier choice, pre-warmed
pool and its refill, backoff) runs on a `ManualClock` against an `InMemoryState`, with
`SimulatedLauncher` runners that drain by the runner's own `idle_action` and the guard
of try_drain.lua; refusals get `retry_after_for`, as the frontdoor's do.

What is modelled, not measured: service and start times (`RunnerModel`); every
admission wakes the controller (as enqueue.lua does) and it reconciles within the tick;
a fork server, when on, is up from the start; the platform starts with its pool full
(`ebb up` waits for it) and min_replicas up; ticks are `tick_s` apart.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, deque
from dataclasses import dataclass, field

from ebb.coldstart.clock import ManualClock
from ebb.coldstart.controller import Controller
from ebb.coldstart.estimate import retry_after_for
from ebb.coldstart.policy import PolicyConfig
from ebb.coldstart.simulation_runners import RunnerModel, SimRunner, SimulatedLauncher
from ebb.coldstart.simulation_state import InMemoryState, Queued
from ebb.coldstart.simulation_trace import TraceRequest, load_azure_trace
from ebb.config import Settings
from ebb.config.serving import RunnerSettings
from ebb.launching.tiers import WarmState
from ebb.queue.scaling_spec import ScalingSpec
from ebb.queue.schema import DeploymentSpec

__all__ = [
    "FLAP_WINDOW_S",
    "RunnerModel",
    "ScalingSettings",
    "SimulatedPlatform",
    "SimulationResult",
    "TraceRequest",
    "load_azure_trace",
    "simulate",
]

DEPLOYMENT = "sim"
# Starts within this long of a drain: capacity given back and taken again.
FLAP_WINDOW_S = 10.0


@dataclass(frozen=True)
class ScalingSettings:
    """A deployment's scaling fields and the platform settings that shape its starts."""

    min_replicas: int = 0
    max_replicas: int = 4
    target_concurrency: int = 8
    idle_timeout_s: float = 60.0
    admission_timeout_s: float = 10.0
    prewarm: int = 1
    # Runners beyond the pool are forked from the fork server (else fresh processes).
    fork_server: bool = True
    controller_poll_s: float = 0.5
    # The deployment's `scaling` block (the default: the queue-only rule, fixed window).
    scaling: ScalingSpec = ScalingSpec()
    # Least-loaded claiming's wait (`EBB_CLAIM_BALANCE_MS`; 0: runners claim in turn).
    claim_balance_ms: int = RunnerSettings.model_fields["claim_balance_ms"].default

    def spec(self, name: str = DEPLOYMENT) -> DeploymentSpec:
        return DeploymentSpec(
            name=name,
            source="sim://",
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            idle_timeout_s=self.idle_timeout_s,
            max_concurrency=self.target_concurrency,
            admission_timeout_s=self.admission_timeout_s,
            scaling=self.scaling,
        )


class SimulatedPlatform:
    """The real `Controller` over simulated state, runners and time; also the harness
    controller tests run on."""

    def __init__(
        self,
        settings: ScalingSettings = ScalingSettings(),
        model: RunnerModel = RunnerModel(),
        policy: PolicyConfig = PolicyConfig(),
        *,
        failing: frozenset[str] = frozenset(),
        wall_start_s: float | None = None,
    ):
        """`wall_start_s`: the wall clock at simulated time 0 (schedules read it)."""
        self.settings = settings
        self.clock = (
            ManualClock() if wall_start_s is None else ManualClock(wall_start_s=wall_start_s)
        )
        self.state = InMemoryState(self.clock)
        self.launcher = SimulatedLauncher(
            self.clock,
            self.state,
            model,
            forks=settings.fork_server,
            failing=failing,
            balance_wait_ms=settings.claim_balance_ms,
        )
        platform = Settings(
            prewarm=settings.prewarm, controller_poll_s=settings.controller_poll_s, metering=False
        )
        self.controller = Controller(
            platform,
            self.state,
            self.launcher,
            policy,
            warm=self.launcher,
            clock=self.clock,
            scaling=self.state,
        )
        self._next_reconcile_s = 0.0

    def deploy(self, spec: DeploymentSpec) -> None:
        self.state.deployments[spec.name] = spec

    async def start(self) -> None:
        """The platform's first reconcile, with what it starts up before traffic: the
        pool (`ebb up` reports ready once its stems are) and the deployments'
        `min_replicas` (an always-on deployment is on before the trace begins)."""
        await self.controller.reconcile()
        now = self.clock.now_s
        for proc in self.launcher.procs.values():
            if proc.ready_at_s is None:
                proc.pooled_at_s = now
            else:
                proc.ready_at_s = now
        self.launcher.advance()

    async def run_until(self, until_s: float, tick_s: float = 0.05) -> None:
        """Every part takes its turn each tick (runner starts, serving, the controller)
        until simulated time reaches `until_s`."""
        while self.clock.now_s + tick_s <= until_s + 1e-9:
            self.clock.advance(tick_s)
            self.launcher.advance()
            for name in list(self.state.deployments):
                self.launcher.serve(name)
            await self.control()

    async def control(self) -> None:
        """The controller's turn, as its run loop takes it: reconcile when woken by an
        admission or when the poll interval has passed."""
        woken = await self.state.wait_for_wake(0.0)
        if woken or self.clock.now_s >= self._next_reconcile_s:
            await self.controller.reconcile()
            self._next_reconcile_s = self.clock.now_s + self.settings.controller_poll_s


@dataclass
class SimulationResult:
    requests: int = 0
    admitted: int = 0
    refused: int = 0
    waits_s: list[float] = field(default_factory=list)
    retry_after_s: list[int] = field(default_factory=list)
    # Admitted by a runner that came up after the request arrived: it waited on a start.
    admitted_after_start: int = 0
    # Refusals with no runner ready, only starting ones: the request waited on a cold start.
    refused_while_starting: int = 0
    # Of those, the ones whose Retry-After ended before any of the runners was ready: a
    # client that trusted it would come back too early.
    retry_after_early: int = 0
    # The arrival of each request that waited on a cold start (admitted after a start, or
    # refused while starting), in the order their waits ended: where the waits came from.
    cold_wait_arrivals_s: list[float] = field(default_factory=list)
    starts: Counter[str] = field(default_factory=Counter)
    drains: int = 0
    # Starts within `FLAP_WINDOW_S` of a drain: capacity given back and taken again.
    flaps: int = 0
    # Starts within `FLAP_WINDOW_S` of a drain the controller directed (a policy's
    # scale-in, `DrainReady`), not of a runner's own idle drain: the policy's reversals.
    policy_reversals: int = 0
    runner_seconds: float = 0.0
    peak_replicas: int = 0
    zero_periods: int = 0
    duration_s: float = 0.0
    # Runners serving the deployment at each tick (of `tick_s`): when capacity was held.
    serving_per_tick: list[int] = field(default_factory=list)
    tick_s: float = 0.0
    # Each admitted request's time to first token (queue wait and prefill).
    ttfts_s: list[float] = field(default_factory=list)
    # Each admitted request's time per output token (at the batch it joined).
    tpots_s: list[float] = field(default_factory=list)

    def slo_attainment(self, ttft_s: float) -> float:
        """Share of all requests (refused ones miss) with a first token within `ttft_s`."""
        met = sum(t <= ttft_s for t in self.ttfts_s)
        return met / self.requests if self.requests else 1.0

    @property
    def refused_fraction(self) -> float:
        return self.refused / self.requests if self.requests else 0.0

    @property
    def cold_wait_fraction(self) -> float:
        """Share of requests that waited on a cold start (admitted or refused)."""
        waited = self.admitted_after_start + self.refused_while_starting
        return waited / self.requests if self.requests else 0.0

    def tpot_percentile_s(self, p: float) -> float:
        return _percentile(self.tpots_s, p)

    def wait_percentile_s(self, p: float) -> float:
        return _percentile(self.waits_s, p)


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1)]


def simulate(
    trace: list[TraceRequest],
    settings: ScalingSettings,
    model: RunnerModel = RunnerModel(),
    policy: PolicyConfig = PolicyConfig(),
    *,
    tick_s: float = 0.05,
) -> SimulationResult:
    """Replay `trace` until every request was served or refused; see the module doc.

    Runner-seconds (of runners given to the deployment, from launch or assignment to
    exit) stop with the last request served: the idle tail is not counted.
    """
    return asyncio.run(_Replay(trace, SimulatedPlatform(settings, model, policy)).run(tick_s))


class _Replay:
    """One replay; each tick follows the platform's order: arrivals, runner starts, the
    runners' serving turn (finish, claim, idle drain), the admission window, then the
    controller."""

    def __init__(self, trace: list[TraceRequest], platform: SimulatedPlatform):
        self.platform = platform
        self.state, self.launcher = platform.state, platform.launcher
        self.result = SimulationResult(requests=len(trace))
        self.arrivals = deque(trace)
        self.cold_starts_ms = platform.launcher.model.cold_starts_ms()
        self.last_drain_s = -math.inf
        self.runners_seen: set[str] = set()

    async def run(self, tick_s: float) -> SimulationResult:
        self.platform.deploy(self.platform.settings.spec())
        await self.platform.start()
        queue = self.state.queues.setdefault(DEPLOYMENT, deque())
        tick, at_zero = 0, True
        while self.arrivals or queue or self._busy():
            now = tick * tick_s
            tick += 1
            self.platform.clock.advance_to(now)
            while self.arrivals and self.arrivals[0].arrival_s <= now:
                request = self.arrivals.popleft()
                self.state.enqueue(DEPLOYMENT, request, at_s=request.arrival_s)
            self.launcher.advance()
            drained = self.launcher.serve(DEPLOYMENT, self._claimed)
            self.result.drains += len(drained)
            if drained:
                self.last_drain_s = now
            self._refuse_expired(queue, now)
            await self.platform.control()
            serving = self._count_serving()
            self.result.runner_seconds += serving * tick_s
            self.result.serving_per_tick.append(serving)
            self.result.peak_replicas = max(self.result.peak_replicas, serving)
            if not serving and not at_zero:
                self.result.zero_periods += 1
            at_zero = not serving
        self.result.duration_s = tick * tick_s
        self.result.tick_s = tick_s
        return self.result

    def _busy(self) -> bool:
        return any(p.busy_until_s for p in self.launcher.procs.values())

    def _count_serving(self) -> int:
        """Runners given to the deployment and still running; each new one is a start."""
        now = self.platform.clock.now_s
        count = 0
        for proc in self.launcher.procs.values():
            if proc.deployment != DEPLOYMENT:
                continue
            count += 1
            if proc.runner_id not in self.runners_seen:
                self.runners_seen.add(proc.runner_id)
                self.result.starts[proc.tier] += 1
                if now - self.last_drain_s < FLAP_WINDOW_S:
                    self.result.flaps += 1
                if now - self.state.last_drain_ready_s < FLAP_WINDOW_S:
                    self.result.policy_reversals += 1
        return count

    def _claimed(self, queued: Queued, proc: SimRunner) -> None:
        now = self.platform.clock.now_s
        self.result.admitted += 1
        self.result.waits_s.append(now - queued.enqueued_s)
        prefill_s = queued.request.prompt_tokens / self.launcher.model.prefill_tokens_per_s
        self.result.ttfts_s.append(now - queued.enqueued_s + prefill_s)
        self.result.tpots_s.append(self.launcher.model.tpot_s(len(proc.busy_until_s)))
        if proc.ready_at_s is not None and proc.ready_at_s > queued.enqueued_s:
            self.result.admitted_after_start += 1
            self.result.cold_wait_arrivals_s.append(queued.enqueued_s)

    def _refuse_expired(self, queue: deque[Queued], now: float) -> None:
        timeout_s = self.platform.settings.admission_timeout_s
        while queue and now - queue[0].enqueued_s >= timeout_s:
            expired = queue.popleft()
            self.result.refused += 1
            records = list(self.state.records.values())
            retry_s = retry_after_for(
                DEPLOYMENT,
                records,
                self.cold_starts_ms,
                fork_server_ready=self.launcher.warm_state() is WarmState.READY,
                now_ms=self.platform.clock.ms(),
            )
            self.result.retry_after_s.append(retry_s)
            mine = [r for r in records if r.deployment == DEPLOYMENT and r.state.is_live]
            starting = [r for r in mine if r.is_starting]
            if starting and len(starting) == len(mine):  # waited on a cold start
                self.result.refused_while_starting += 1
                self.result.cold_wait_arrivals_s.append(expired.enqueued_s)
                procs = [self.launcher.procs.get(r.runner_id) for r in starting]
                ready_at = [p.ready_at_s for p in procs if p and p.ready_at_s is not None]
                if ready_at and now + retry_s < min(ready_at):
                    self.result.retry_after_early += 1
