"""Where the GPU-seconds went, as metrics: `ebb_gpu_use_seconds_total{deployment,tenant,use}`
(the metered GPU-seconds split by use, billing/gpu_split.py: its uses add up to
`ebb_gpu_seconds_total`) and the design's yardstick `ebb_tokens_per_gpu_second{deployment}`
(output tokens per metered GPU-second, every use counted). Both are folded from the same
streams as the other scraped counters, from this process's start."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from ebb.billing.entries import gpu_uses
from ebb.billing.gpu_split import USES, use_metric
from ebb.queue.metering import GpuSegment
from ebb.queue.schema import UsageRecord


class GpuUseFamilies:
    def __init__(self, registry: CollectorRegistry, tenant_label: Callable[[str], str]) -> None:
        self._tenant_label = tenant_label
        self.use_seconds = Counter(
            "ebb_gpu_use_seconds",
            "Metered GPU-seconds by use (serving, loading, idle, asleep, wasted); they add up "
            "to ebb_gpu_seconds_total",
            ["deployment", "tenant", "use"],
            registry=registry,
        )
        self._gpu_ms: dict[str, int] = defaultdict(int)
        self._output: dict[str, int] = defaultdict(int)

    def fold_segment(self, segment: GpuSegment) -> None:
        m = segment.meter
        gpu_ms = max(0, segment.duration_ms) * m.gpu_count
        parts = gpu_uses(gpu_ms, segment.uses_ms)
        tenant = self._tenant_label(m.tenant)
        for use in USES:
            if parts[use_metric(use)]:
                self.use_seconds.labels(m.deployment, tenant, use).inc(
                    parts[use_metric(use)] / 1000
                )
        self._gpu_ms[m.deployment] += gpu_ms

    def fold_usage(self, usage: UsageRecord) -> None:
        self._output[usage.deployment] += usage.completion_tokens

    def yardstick(self) -> Metric:
        gauge = GaugeMetricFamily(
            "ebb_tokens_per_gpu_second",
            "Output tokens per metered GPU-second (idle, loading and waste included), "
            "since this process started",
            labels=["deployment"],
        )
        for deployment, gpu_ms in sorted(self._gpu_ms.items()):
            if gpu_ms:
                gauge.add_metric([deployment], self._output[deployment] * 1000 / gpu_ms)
        return gauge
