"""Prometheus metrics for the whole platform, served by the frontdoor at /metrics.

Request metrics (outcomes, latencies) are this process's own, counted as requests pass.
Everything other processes know — cold starts, tokens and GPU time from the usage streams,
jobs, webhook deliveries, weight fetches, each runner's engine figures, runner and queue
gauges — is read from Redis at scrape time (`metrics_scraped`), so it describes every
process of the platform, whichever frontdoor replica answers the scrape.

Cardinality: labels are deployment names (which exist: an unknown model is counted under
deployment ""), outcomes and codes from fixed sets, runner ids of live runners only, and
tenants only on token counters, capped at `EBB_METRICS_MAX_TENANTS` (the rest as "other").
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import redis.exceptions
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from ebb.frontdoor.metrics_scraped import ScrapedFamilies, weights_families
from ebb.queue.observations import ObservationReader
from ebb.queue.platform import PlatformState

_WAIT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_COLD_START_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 120, 300)
# Roughly 1.5x apart from 5 ms to a minute: p50, p99 and p99.9 interpolate within a bucket
# whose bounds differ by half, wherever the latency sits.
_TTFT_BUCKETS_S = (
    0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.15, 0.25, 0.4, 0.6, 1, 1.5, 2.5, 4, 6,
    10, 15, 25, 40, 60,
)  # fmt: skip
_TPOT_BUCKETS_S = (
    0.001, 0.0015, 0.0025, 0.004, 0.006, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.15, 0.25,
    0.4, 0.6, 1, 2,
)  # fmt: skip
_LATENCY_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.4, 0.6, 1, 1.5, 2.5, 4, 6, 10, 15, 25, 40, 60,
    120, 300,
)  # fmt: skip


class BoundedLabel:
    """At most `limit` distinct values of one label; later newcomers become "other"."""

    def __init__(self, limit: int):
        self._limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) >= self._limit:
            return "other"
        self._seen.add(value)
        return value


class Metrics:
    def __init__(
        self,
        weights_dir: Path | None = None,
        weights_budget_bytes: int | None = None,
        *,
        max_tenants: int = 50,
        gpu_second_cost_micros: int = 0,
    ) -> None:
        self.weights_dir = weights_dir
        self.weights_budget_bytes = weights_budget_bytes
        self.registry = CollectorRegistry()
        self._children: dict[tuple[object, ...], Any] = {}
        self.tenant_label = BoundedLabel(max_tenants)
        self.requests = Counter(
            "ebb_http_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.outcomes = Counter(
            "ebb_requests",
            "Inference requests by deployment and outcome (ok, client_error, rate_limited, "
            "unavailable, runner_lost, cancelled, error); code: HTTP status or 503 reason",
            ["deployment", "outcome", "code"],
            registry=self.registry,
        )
        self.queue_wait = _histogram(
            self.registry,
            "ebb_queue_wait_seconds",
            "Time from enqueue to a runner's claim",
            _WAIT_BUCKETS_S,
        )
        self.ttft = _histogram(
            self.registry,
            "ebb_time_to_first_token_seconds",
            "From the request's arrival to its first output token leaving the frontdoor",
            _TTFT_BUCKETS_S,
        )
        self.tpot = _histogram(
            self.registry,
            "ebb_time_per_output_token_seconds",
            "Per request: (last token - first token) / (completion tokens - 1)",
            _TPOT_BUCKETS_S,
        )
        self.latency = _histogram(
            self.registry,
            "ebb_request_duration_seconds",
            "End to end: from the request's arrival to its last byte (or its refusal)",
            _LATENCY_BUCKETS_S,
        )
        self.cold_start = Histogram(
            "ebb_cold_start_seconds",
            "Runner cold starts by deployment, tier and phase (phase 'total' is the whole start)",
            ["deployment", "tier", "phase"],
            buckets=_COLD_START_BUCKETS_S,
            registry=self.registry,
        )
        self._scraped = ScrapedFamilies(
            self.registry,
            self.cold_start,
            self.tenant_label,
            started_ms=int(time.time() * 1000),
            gpu_second_cost_micros=gpu_second_cost_micros,
        )

    def observe_admitted(self, deployment: str, queued_s: float) -> None:
        self._child(self.queue_wait, deployment).observe(queued_s)

    def count(self, route: str, status: int) -> None:
        self._child(self.requests, route, status).inc()

    def observe_request(
        self,
        deployment: str,
        outcome: str,
        code: str,
        *,
        duration_s: float,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
    ) -> None:
        """One inference request ended (answered, refused, failed or abandoned)."""
        self._child(self.outcomes, deployment, outcome, code).inc()
        self._child(self.latency, deployment).observe(duration_s)
        if ttft_s is not None:
            self._child(self.ttft, deployment).observe(ttft_s)
        if tpot_s is not None:
            self._child(self.tpot, deployment).observe(tpot_s)

    def _child(self, metric: Any, *labels: object) -> Any:
        """`metric.labels(*labels)`, remembered: `labels` checks and converts its values
        and takes the metric's lock on every call, several times per request. A child
        stays valid while its metric lives (these are never `remove`d); the values are
        the bounded label sets the module docstring lists."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*(str(v) for v in labels))
        return child

    async def render(self, state: PlatformState) -> bytes:
        scraped = CollectorRegistry(auto_describe=False)
        try:
            families = await self._scraped.read(state, ObservationReader(state.redis))
            families.append(_gauge("ebb_redis_up", "1 when /metrics could read Redis", 1))
            memory = await state.memory()
            families += [
                _gauge(
                    "ebb_redis_used_memory_bytes",
                    "Redis's used memory",
                    memory["used_memory_bytes"],
                ),
                _gauge(
                    "ebb_redis_maxmemory_bytes",
                    "Redis's maxmemory (0: none)",
                    memory["maxmemory_bytes"],
                ),
            ]
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            families = [_gauge("ebb_redis_up", "1 when /metrics could read Redis", 0)]
        if self.weights_dir is not None:
            families += await asyncio.to_thread(
                weights_families, self.weights_dir, self.weights_budget_bytes
            )
        scraped.register(_Families(families))
        return generate_latest(self.registry) + generate_latest(scraped)


def _histogram(
    registry: CollectorRegistry, name: str, doc: str, buckets: tuple[float, ...]
) -> Histogram:
    return Histogram(name, doc, ["deployment"], buckets=buckets, registry=registry)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], value)
    return family


class _Families:
    """A collector that yields metric families read once, for one scrape."""

    def __init__(self, families: list[Metric]):
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families
