"""Metric families read from Redis at scrape time: what other processes know.

Streams (cold starts, usage, GPU time) are folded into this process's histograms and
counters from where the last scrape stopped; the usage and GPU streams from this
process's start (a counter starts at zero with its process, as Prometheus expects).
Shared counters, runner figures and gauges are read as they stand.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ebb.frontdoor.metrics_gpu_split import GpuUseFamilies
from ebb.queue import observations
from ebb.queue.observations import ObservationReader, RunnerStats
from ebb.queue.platform import PlatformState
from ebb.queue.schema import RunnerState

# Shared counters (ebb.queue.observations) as exported: name -> (metric, help, labels).
_SHARED_COUNTERS = {
    observations.JOBS: (
        "ebb_jobs",
        "Async jobs settled, by deployment and outcome",
        ["deployment", "outcome"],
    ),
    observations.WEBHOOK_DELIVERIES: (
        "ebb_webhook_deliveries",
        "Webhook delivery attempts by outcome (delivered, retry, failed)",
        ["outcome"],
    ),
    observations.WEIGHTS_FETCHED_BYTES: (
        "ebb_weights_fetched_bytes",
        "Bytes of model weights fetched or converted into the cache, by source kind",
        ["source"],
    ),
    observations.ENGINE_STALLS: (
        "ebb_engine_stalls",
        "Runners killed by their watchdog because an engine step ran past "
        "EBB_ENGINE_STALL_S while they held requests",
        ["deployment"],
    ),
    observations.ADAPTER_LOADS: (
        "ebb_adapter_loads",
        "LoRA adapters loaded into a base's runner for a request (cold loads), by adapter "
        "deployment and base",
        ["deployment", "base"],
    ),
}


class ScrapedFamilies:
    def __init__(
        self,
        registry: CollectorRegistry,
        cold_start: Histogram,
        tenant_label: Callable[[str], str],
        *,
        started_ms: int,
        gpu_second_cost_micros: int,
    ) -> None:
        self._cold_start = cold_start
        self._tenant_label = tenant_label
        self._cold_starts_seen = b"0-0"
        self._usage_seen = f"{started_ms}-0"
        self._gpu_seen = f"{started_ms}-0"
        self._gpu_second_cost = gpu_second_cost_micros / 1_000_000
        self.prompt_tokens = Counter(
            "ebb_prompt_tokens",
            "Prompt tokens of finished requests and job attempts (metered usage)",
            ["deployment", "tenant"],
            registry=registry,
        )
        self.completion_tokens = Counter(
            "ebb_completion_tokens",
            "Completion tokens of finished requests and job attempts (metered usage)",
            ["deployment", "tenant"],
            registry=registry,
        )
        self.gpu_seconds = Counter(
            "ebb_gpu_seconds",
            "GPU-seconds metered (GPUs x seconds; a CPU runner counts as one GPU); "
            "deployment '(pool)' is pre-warmed capacity",
            ["deployment"],
            registry=registry,
        )
        self.gpu_uses = GpuUseFamilies(registry, tenant_label)

    async def read(self, state: PlatformState, reader: ObservationReader) -> list[Metric]:
        await self._fold_streams(state, reader)
        families = await _platform_families(state)
        counters = await reader.counters()
        _seed_stalls(counters, [spec.name for spec in await state.serving_units()])
        families += _shared_counter_families(counters)
        live = [r.runner_id for r in await state.runners() if r.state.is_live]
        families += _runner_families(await reader.runner_stats(live))
        backlog = GaugeMetricFamily(
            "ebb_webhook_backlog", "Webhook deliveries due or in flight (not settled)"
        )
        backlog.add_metric([], await reader.webhook_backlog())
        cost = GaugeMetricFamily(
            "ebb_gpu_second_cost", "What one GPU-second costs the platform (EBB_GPU_SECOND_COST)"
        )
        cost.add_metric([], self._gpu_second_cost)
        return [*families, backlog, cost, self.gpu_uses.yardstick()]

    async def _fold_streams(self, state: PlatformState, reader: ObservationReader) -> None:
        self._cold_starts_seen, records = await state.cold_starts_after(self._cold_starts_seen)
        for record in records:
            for phase, ms in record.phases_ms.items():
                self._cold_start.labels(record.deployment, record.tier, phase).observe(ms / 1000)
        self._usage_seen, usage = await reader.usage_after(self._usage_seen)
        for u in usage:
            tenant = self._tenant_label(u.tenant)
            self.prompt_tokens.labels(u.deployment, tenant).inc(u.prompt_tokens)
            self.completion_tokens.labels(u.deployment, tenant).inc(u.completion_tokens)
            self.gpu_uses.fold_usage(u)
        self._gpu_seen, segments = await reader.gpu_segments_after(self._gpu_seen)
        for segment in segments:
            gpu_s = segment.duration_ms / 1000 * segment.meter.gpu_count
            self.gpu_seconds.labels(segment.meter.deployment).inc(max(0.0, gpu_s))
            self.gpu_uses.fold_segment(segment)


def _seed_stalls(
    counters: dict[str, list[tuple[tuple[str, ...], float]]], units: list[str]
) -> None:
    """A zero for each serving unit that never stalled: a series that first appears at 1
    has no increase for an alert to see, so the first stall would go unnoticed."""
    stalls = counters.setdefault(observations.ENGINE_STALLS, [])
    counted = {labels for labels, _ in stalls}
    stalls += [((unit,), 0.0) for unit in units if (unit,) not in counted]


def _shared_counter_families(
    counters: dict[str, list[tuple[tuple[str, ...], float]]],
) -> list[Metric]:
    families: list[Metric] = []
    for name, (metric, doc, labels) in _SHARED_COUNTERS.items():
        family = CounterMetricFamily(metric, doc, labels=labels)
        for values, total in sorted(counters.get(name, [])):
            if len(values) == len(labels):
                family.add_metric(list(values), total)
        families.append(family)
    return families


def _runner_families(stats: list[RunnerStats]) -> list[Metric]:
    labels = ["deployment", "runner"]
    kv = GaugeMetricFamily(
        "ebb_kv_cache_usage_ratio", "Share of the engine's KV cache in use", labels=labels
    )
    hit = GaugeMetricFamily(
        "ebb_prefix_cache_hit_ratio",
        "Prompt tokens found in the prefix cache / prompt tokens looked up, since load",
        labels=labels,
    )
    queried = CounterMetricFamily(
        "ebb_prefix_cache_queried_tokens",
        "Prompt tokens looked up in the prefix cache",
        labels=labels,
    )
    hits = CounterMetricFamily(
        "ebb_prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache", labels=labels
    )
    batch = GaugeMetricFamily(
        "ebb_batch_size", "Requests in the runner's running batch", labels=labels
    )
    gpu_labels = ["deployment", "runner", "gpu"]
    util = GaugeMetricFamily("ebb_gpu_utilization_ratio", "GPU busy share", labels=gpu_labels)
    mem = GaugeMetricFamily("ebb_gpu_memory_used_bytes", "GPU memory used", labels=gpu_labels)
    temp = GaugeMetricFamily("ebb_gpu_temperature_celsius", "GPU temperature", labels=gpu_labels)
    for s in stats:
        key = [s.deployment, s.runner_id]
        batch.add_metric(key, s.batch_size)
        if s.kv_cache_usage_ratio is not None:
            kv.add_metric(key, s.kv_cache_usage_ratio)
        queried.add_metric(key, s.prefix_cache_queried_tokens)
        hits.add_metric(key, s.prefix_cache_hit_tokens)
        if s.prefix_cache_queried_tokens:
            hit.add_metric(key, s.prefix_cache_hit_tokens / s.prefix_cache_queried_tokens)
        for g in s.gpus:
            gpu_key = [*key, str(g.index)]
            util.add_metric(gpu_key, g.utilization_pct / 100)
            mem.add_metric(gpu_key, g.used_bytes)
            temp.add_metric(gpu_key, g.temperature_c)
    return [kv, hit, queried, hits, batch, util, mem, temp]


async def _platform_families(state: PlatformState) -> list[Metric]:
    runners = GaugeMetricFamily(
        "ebb_runners", "Runners by deployment and state", labels=["deployment", "state"]
    )
    depth = GaugeMetricFamily("ebb_queue_depth", "Requests waiting", labels=["deployment"])
    oldest = GaugeMetricFamily(
        "ebb_queue_oldest_wait_seconds",
        "How long the oldest waiting request has waited",
        labels=["deployment"],
    )
    failing = GaugeMetricFamily(
        "ebb_deployment_failing",
        "1 while a deployment cannot start a runner",
        labels=["deployment"],
    )
    cold = GaugeMetricFamily(
        "ebb_cold_start_seconds_avg",
        "Moving average of cold-start phases by deployment, tier and phase",
        labels=["deployment", "tier", "phase"],
    )
    counts: dict[tuple[str, str], int] = {}
    for r in await state.runners():
        if r.state.is_live:
            counts[(r.deployment, r.state.value)] = counts.get((r.deployment, r.state.value), 0) + 1
    # Per serving unit: a version after the first is labelled "NAME@vN".
    for spec in await state.serving_units():
        for s in RunnerState:
            if s.is_live:
                counts.setdefault((spec.name, s.value), 0)
        snapshot = await state.queue_snapshot(spec.name)
        depth.add_metric([spec.name], snapshot.depth)
        oldest.add_metric([spec.name], snapshot.oldest_wait_s)
        status = await state.deployment_status(spec.name)
        failing.add_metric([spec.name], 1 if status.get("error") else 0)
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
    return [runners, depth, oldest, failing, cold, decisions]


def weights_families(weights_dir: Path, budget_bytes: int | None) -> list[Metric]:
    """The local weight cache: bytes held, models by state, evictions so far."""
    from ebb.weights_cache import cache_report

    report = cache_report(weights_dir, budget_bytes)
    used = GaugeMetricFamily("ebb_weights_cache_bytes", "Bytes the weight cache holds")
    used.add_metric([], report.used_bytes)
    models = GaugeMetricFamily(
        "ebb_weights_cache_models", "Cached models by state", labels=["state"]
    )
    states = {"in_use": 0, "idle": 0, "partial": 0}
    for entry in report.entries:
        states["partial" if entry.partial else "in_use" if entry.in_use else "idle"] += 1
    for name, count in states.items():
        models.add_metric([name], count)
    evictions = CounterMetricFamily(
        "ebb_weights_evictions", "Models evicted from the weight cache to stay under budget"
    )
    evictions.add_metric([], report.evictions_total)
    evicted = CounterMetricFamily("ebb_weights_evicted_bytes", "Bytes evicted from the cache")
    evicted.add_metric([], report.evicted_bytes_total)
    families = [used, models, evictions, evicted]
    if budget_bytes is not None:
        budget = GaugeMetricFamily("ebb_weights_cache_budget_bytes", "EBB_WEIGHTS_CACHE_BYTES")
        budget.add_metric([], budget_bytes)
        families.append(budget)
    return families
