"""Prometheus metrics for the whole platform, served by the frontdoor at /metrics.

Request metrics are counted here as requests pass; runner and queue gauges are read from
Redis at scrape time, so they describe every process of the platform, not just this one.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ebb.queue.platform import PlatformState
from ebb.queue.schema import RunnerState

_WAIT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_COLD_START_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "ebb_http_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "ebb_queue_wait_seconds",
            "Time from enqueue to a runner's claim",
            ["deployment"],
            buckets=_WAIT_BUCKETS_S,
            registry=self.registry,
        )

        self.cold_start = Histogram(
            "ebb_cold_start_seconds",
            "Runner cold starts by deployment, tier and phase (phase 'total' is the whole start)",
            ["deployment", "tier", "phase"],
            buckets=_COLD_START_BUCKETS_S,
            registry=self.registry,
        )
        self._cold_starts_seen = b"0-0"

    async def _observe_cold_starts(self, state: PlatformState) -> None:
        """Runners append their cold starts to a stream; fold in what is new since the
        last scrape (this process's histogram, like any counter, starts at its start)."""
        self._cold_starts_seen, records = await state.cold_starts_after(self._cold_starts_seen)
        for record in records:
            for phase, ms in record.phases_ms.items():
                self.cold_start.labels(record.deployment, record.tier, phase).observe(ms / 1000)

    def observe_admitted(self, deployment: str, queued_s: float) -> None:
        self.queue_wait.labels(deployment).observe(queued_s)

    def count(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    async def render(self, state: PlatformState) -> bytes:
        await self._observe_cold_starts(state)
        scraped = CollectorRegistry(auto_describe=False)
        scraped.register(_Families(await _platform_families(state)))
        return generate_latest(self.registry) + generate_latest(scraped)


class _Families:
    """A collector that yields metric families read once, for one scrape."""

    def __init__(self, families: list):
        self._families = families

    def collect(self):
        return self._families


async def _platform_families(state: PlatformState) -> list:
    runners = GaugeMetricFamily(
        "ebb_runners", "Runners by deployment and state", labels=["deployment", "state"]
    )
    depth = GaugeMetricFamily("ebb_queue_depth", "Requests waiting", labels=["deployment"])
    cold = GaugeMetricFamily(
        "ebb_cold_start_seconds_avg",
        "Moving average of cold-start phases by deployment, tier and phase",
        labels=["deployment", "tier", "phase"],
    )
    counts: dict[tuple[str, str], int] = {}
    for r in await state.runners():
        if r.state.is_live:
            counts[(r.deployment, r.state.value)] = counts.get((r.deployment, r.state.value), 0) + 1
    for spec in await state.list_deployments():
        for s in RunnerState:
            if s.is_live:
                counts.setdefault((spec.name, s.value), 0)
        depth.add_metric([spec.name], (await state.queue_snapshot(spec.name)).depth)
        for tier, phases in (await state.cold_start_ms(spec.name)).items():
            for phase, ms in phases.items():
                cold.add_metric([spec.name, tier, phase], ms / 1000)
    for (dep, st), n in sorted(counts.items()):
        runners.add_metric([dep, st], n)
    decisions = CounterMetricFamily(
        "ebb_scale_decisions",
        "Runners added (up) and drained when idle (down)",
        labels=["deployment", "direction"],
    )
    for (dep, direction), n in sorted((await state.scale_decisions()).items()):
        decisions.add_metric([dep, direction], n)
    return [runners, depth, cold, decisions]
