"""Replay a request trace through the autoscaling policy on a simulated clock.

What a deployment's traffic would meet under its scaling settings (how long requests
wait, how many are refused at the admission window and with what `Retry-After`, how many
runner-seconds it costs) without starting a process. The decisions are the platform's
own: `desired_replicas` on the controller's snapshot, idle drain only above
`min_replicas`, the pre-warmed pool and its refill, forked starts beyond it,
`retry_after_s` for refusals. What is modelled: a runner serves up to
`target_concurrency` requests at once, each for prompt / prefill rate + output / decode
rate seconds, and a start takes its tier's time.
"""

from __future__ import annotations

import csv
import math
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ebb.coldstart.estimate import StartingRunner, retry_after_s
from ebb.coldstart.policy import DemandSnapshot, PolicyConfig, desired_replicas


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


def load_azure_trace(
    path: Path, *, start_s: float = 0.0, duration_s: float | None = None
) -> list[TraceRequest]:
    """The Azure LLM inference trace format (TIMESTAMP, ContextTokens, GeneratedTokens),
    arrivals in seconds from the trace's first request, cut to [start_s, start_s + duration_s)
    and shifted to start at 0."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    stamps = [_seconds(row["TIMESTAMP"]) for row in rows]
    first = min(stamps)
    end = math.inf if duration_s is None else start_s + duration_s
    requests = [
        TraceRequest(at - first - start_s, int(row["ContextTokens"]), int(row["GeneratedTokens"]))
        for at, row in zip(stamps, rows, strict=True)
        if start_s <= at - first < end
    ]
    return sorted(requests, key=lambda r: r.arrival_s)


def _seconds(stamp: str) -> float:
    # Seven fractional digits: more than datetime parses, so the fraction is added apart.
    whole, _, fraction = stamp.partition(".")
    parsed = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    return parsed.timestamp() + (float("0." + fraction) if fraction else 0.0)


@dataclass(frozen=True)
class RunnerModel:
    """How fast a runner serves and starts. Defaults: the default model on a 2-core CPU
    machine (bench.serving, bench.coldstart), rounded."""

    prefill_tokens_per_s: float = 2000.0
    decode_tokens_per_s: float = 25.0
    prewarmed_start_s: float = 2.0
    forked_start_s: float = 2.0
    fresh_start_s: float = 10.0
    # A new stem is usable this long after it is launched (imports).
    stem_import_s: float = 8.0

    def service_s(self, request: TraceRequest) -> float:
        return (
            request.prompt_tokens / self.prefill_tokens_per_s
            + request.output_tokens / self.decode_tokens_per_s
        )

    def start_s(self, tier: str) -> float:
        return {"prewarmed": self.prewarmed_start_s, "forked": self.forked_start_s}.get(
            tier, self.fresh_start_s
        )


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


@dataclass
class _Runner:
    tier: str
    started_s: float
    ready_s: float
    busy_until: list[float] = field(default_factory=list)
    idle_since_s: float = 0.0

    def ready(self, now: float) -> bool:
        return now >= self.ready_s


@dataclass
class SimulationResult:
    requests: int = 0
    admitted: int = 0
    refused: int = 0
    waits_s: list[float] = field(default_factory=list)
    retry_after_s: list[int] = field(default_factory=list)
    # Refusals with no runner ready, only starting ones: the request waited on a cold start.
    refused_while_starting: int = 0
    # Of those, the ones whose Retry-After ended before any of the runners was ready: a
    # client that trusted it would come back too early.
    retry_after_early: int = 0
    starts: Counter = field(default_factory=Counter)
    drains: int = 0
    # Starts within `FLAP_WINDOW_S` of a drain: capacity given back and taken again.
    flaps: int = 0
    runner_seconds: float = 0.0
    peak_replicas: int = 0
    zero_periods: int = 0
    duration_s: float = 0.0

    @property
    def refused_fraction(self) -> float:
        return self.refused / self.requests if self.requests else 0.0

    def wait_percentile_s(self, p: float) -> float:
        if not self.waits_s:
            return 0.0
        ordered = sorted(self.waits_s)
        return ordered[min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1)]


FLAP_WINDOW_S = 10.0


def simulate(
    trace: list[TraceRequest],
    settings: ScalingSettings,
    model: RunnerModel = RunnerModel(),
    policy: PolicyConfig = PolicyConfig(),
    *,
    tick_s: float = 0.05,
) -> SimulationResult:
    """Replay `trace` until every request was served or refused; see the module doc.

    Runner-seconds stop with the last request served: the idle tail is not counted.
    """
    return _Simulation(trace, settings, model, policy).run(tick_s)


class _Simulation:
    """One replay; each tick follows the platform's order: arrivals, completions, claims,
    the admission window, idle drain, then (when due or woken) the controller."""

    def __init__(
        self,
        trace: list[TraceRequest],
        settings: ScalingSettings,
        model: RunnerModel,
        policy: PolicyConfig,
    ):
        self.settings, self.model, self.policy = settings, model, policy
        self.result = SimulationResult(requests=len(trace))
        self.arrivals = deque(trace)
        self.queue: deque[TraceRequest] = deque()
        self.runners: list[_Runner] = []
        self.stems: list[float] = [0.0] * settings.prewarm  # when each stem is usable
        self.cold_starts_ms = {
            tier: {"total": model.start_s(tier) * 1000} for tier in ("prewarmed", "forked", "fresh")
        }
        self.last_drain_s = -math.inf
        self.next_reconcile_s = 0.0

    def run(self, tick_s: float) -> SimulationResult:
        tick = 0
        at_zero = True
        while self.arrivals or self.queue or any(r.busy_until for r in self.runners):
            now = tick * tick_s
            tick += 1
            woken = self._arrive(now)
            self._complete(now)
            self._claim(now)
            self._refuse_expired(now)
            self._drain_idle(now)
            if woken or now >= self.next_reconcile_s:
                self.next_reconcile_s = now + self.settings.controller_poll_s
                self._reconcile(now)
            self.result.runner_seconds += len(self.runners) * tick_s
            self.result.peak_replicas = max(self.result.peak_replicas, len(self.runners))
            if not self.runners and not at_zero:
                self.result.zero_periods += 1
            at_zero = not self.runners
        self.result.duration_s = tick * tick_s
        return self.result

    def _arrive(self, now: float) -> bool:
        """Queue what arrived; True when that wakes the controller (nothing running)."""
        woken = False
        while self.arrivals and self.arrivals[0].arrival_s <= now:
            self.queue.append(self.arrivals.popleft())
            woken = woken or not self.runners
        return woken

    def _complete(self, now: float) -> None:
        for r in self.runners:
            if r.busy_until:
                r.busy_until = [t for t in r.busy_until if t > now]
                if not r.busy_until:
                    r.idle_since_s = now

    def _claim(self, now: float) -> None:
        """Ready runners take queued requests, oldest first, into their free slots."""
        for r in self.runners:
            while (
                r.ready(now) and self.queue and len(r.busy_until) < self.settings.target_concurrency
            ):
                request = self.queue.popleft()
                self.result.admitted += 1
                self.result.waits_s.append(now - request.arrival_s)
                r.busy_until.append(now + self.model.service_s(request))

    def _refuse_expired(self, now: float) -> None:
        timeout_s = self.settings.admission_timeout_s
        while self.queue and now - self.queue[0].arrival_s >= timeout_s:
            self.queue.popleft()
            self.result.refused += 1
            starting = [r for r in self.runners if not r.ready(now)]
            retry_s = retry_after_s(
                ready_runners=len(self.runners) - len(starting),
                cold_starts_ms=self.cold_starts_ms,
                stems_available=any(at <= now for at in self.stems),
                forks_available=self.settings.fork_server,
                starting=[StartingRunner(r.tier, now - r.started_s) for r in starting],
            )
            self.result.retry_after_s.append(retry_s)
            if starting and len(starting) == len(self.runners):  # waited on a cold start
                self.result.refused_while_starting += 1
                if now + retry_s < min(r.ready_s for r in starting):
                    self.result.retry_after_early += 1

    def _drain_idle(self, now: float) -> None:
        """Idle past the timeout, with nothing queued, and above min_replicas: drain."""
        for r in list(self.runners):
            idle_s = now - max(r.idle_since_s, r.ready_s)
            if (
                r.ready(now)
                and not r.busy_until
                and not self.queue
                and idle_s >= self.settings.idle_timeout_s
                and len(self.runners) > self.settings.min_replicas
            ):
                self.runners.remove(r)
                self.result.drains += 1
                self.last_drain_s = now

    def _reconcile(self, now: float) -> None:
        s = self.settings
        snap = DemandSnapshot(
            queue_depth=len(self.queue),
            oldest_wait_s=now - self.queue[0].arrival_s if self.queue else 0.0,
            starting=sum(not r.ready(now) for r in self.runners),
            ready=sum(r.ready(now) for r in self.runners),
            min_replicas=s.min_replicas,
            max_replicas=s.max_replicas,
            target_concurrency=s.target_concurrency,
        )
        for _ in range(desired_replicas(snap, self.policy) - snap.serving):
            self._launch(now)
        # The pool refills once no start for real work competes for the cores.
        if all(r.ready(now) for r in self.runners):
            # A stem forked from the fork server has nothing left to import.
            ready_at = now if s.fork_server else now + self.model.stem_import_s
            self.stems += [ready_at] * (s.prewarm - len(self.stems))

    def _launch(self, now: float) -> None:
        usable = [at for at in self.stems if at <= now]
        if usable:
            self.stems.remove(usable[0])
        tier = "prewarmed" if usable else "forked" if self.settings.fork_server else "fresh"
        self.runners.append(_Runner(tier, now, now + self.model.start_s(tier)))
        self.result.starts[tier] += 1
        if now - self.last_drain_s < FLAP_WINDOW_S:
            self.result.flaps += 1
