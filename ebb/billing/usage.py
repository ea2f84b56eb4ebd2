"""Usage reports from the hourly aggregates: rows grouped as asked, a total, and the unit
economics of each deployment (what a million output tokens cost in GPU time).

Reports include the raw records the consumer has not folded yet, booked by the same rules:
a request's usage is there the moment it ends, not when the consumer gets to it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ebb.billing.adapter_gpu import AdapterOf, adapter_gpu_rows
from ebb.billing.entries import METRICS, book, hour_iso, split_field
from ebb.billing.gpu_costs import gpu_cost_rows
from ebb.billing.pricing import divide_half_up
from ebb.queue.ledger import LedgerView
from ebb.queue.metering import POOL_DEPLOYMENT, HourClosed

GROUP_KEYS = ("tenant", "deployment", "day", "hour")
Aggregates = dict[int, dict[str, int]]


@dataclass(frozen=True)
class UsageQuery:
    start_ms: int
    end_ms: int
    group_by: tuple[str, ...] = ("deployment",)
    tenant: str | None = None  # None: every tenant (admins only)


def with_unfolded(view: LedgerView) -> Aggregates:
    """The view's aggregates with its not yet folded records added, as the consumer will."""
    result = {hour: dict(counts) for hour, counts in view.aggregates.items()}
    closed_ms = view.state.closed_through_ms or 0
    billed: set[str] = set()
    for raw in view.tail:
        if isinstance(raw.record, HourClosed):
            closed_ms = max(closed_ms, raw.record.closed_through_ms)
        for entry in book(raw, closed_ms):
            if entry.request_id in billed:
                continue
            if entry.request_id:
                billed.add(entry.request_id)
            counts = result.setdefault(entry.hour_ms, {})
            for name, n in entry.increments():
                counts[name] = counts.get(name, 0) + n
    return result


def report(
    aggregates: Aggregates,
    query: UsageQuery,
    gpu_second_cost_micros: int,
    adapters: Mapping[str, AdapterOf] | None = None,
) -> dict[str, Any]:
    """{"data": rows, "total": metrics, "unit_economics": per deployment, "gpu_costs": per
    tenant and deployment, "adapter_gpu": each base's GPU time by adapter} for the query
    (`adapters`: the adapter deployments by name)."""
    groups: dict[tuple[str, ...], dict[str, int]] = defaultdict(lambda: dict.fromkeys(METRICS, 0))
    per_deployment: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(METRICS, 0))
    total = dict.fromkeys(METRICS, 0)
    for hour_ms, counts in aggregates.items():
        if not query.start_ms <= hour_ms < query.end_ms:
            continue
        for name, n in counts.items():
            tenant, deployment, metric = split_field(name)
            if query.tenant is not None and tenant != query.tenant:
                continue
            labels: dict[str, str | int] = {
                "tenant": tenant,
                "deployment": deployment,
                "hour": hour_ms,
            }
            key = tuple(_label(k, labels) for k in query.group_by)
            groups[key][metric] += n
            per_deployment[deployment][metric] += n
            total[metric] += n
    rows = [
        {**dict(zip(query.group_by, key, strict=True)), **metrics_view(counts)}
        for key, counts in sorted(groups.items())
    ]
    return {
        "data": rows,
        "total": metrics_view(total),
        "unit_economics": [
            unit_economics(name, counts, gpu_second_cost_micros)
            for name, counts in sorted(per_deployment.items())
            if name != POOL_DEPLOYMENT and counts["gpu_ms"]
        ],
        # Where the GPU-seconds went, per tenant and deployment (gpu_costs.py).
        "gpu_costs": gpu_cost_rows(
            aggregates, query.start_ms, query.end_ms, query.tenant, gpu_second_cost_micros
        ),
        # A base's GPU time shared among the adapters it served, by tokens (adapter_gpu.py).
        "adapter_gpu": adapter_gpu_rows(
            aggregates, query.start_ms, query.end_ms, adapters or {}, query.tenant
        ),
    }


def _label(key: str, labels: dict[str, str | int]) -> str:
    hour_ms = int(labels["hour"])
    if key == "day":
        return time.strftime("%Y-%m-%d", time.gmtime(hour_ms / 1000))
    if key == "hour":
        return hour_iso(hour_ms)
    return str(labels[key])


def metrics_view(counts: dict[str, int]) -> dict[str, int | float]:
    return {
        "requests": counts["requests"],
        "prompt_tokens": counts["prompt_tokens"],
        "completion_tokens": counts["completion_tokens"],
        "gpu_seconds": round(counts["gpu_ms"] / 1000, 3),
        "gpu_ms": counts["gpu_ms"],
        "token_cost_micros": counts["token_cost_micros"],
        "gpu_cost_micros": counts["gpu_cost_micros"],
        "cost_micros": counts["token_cost_micros"] + counts["gpu_cost_micros"],
    }


def unit_economics(
    deployment: str, counts: dict[str, int], gpu_second_cost_micros: int
) -> dict[str, Any]:
    """GPU time per million output tokens, and its cost at the operator's GPU-second cost:
    the floor under a per-token price that pays for the GPUs."""
    output = counts["completion_tokens"]
    gpu_ms = counts["gpu_ms"]
    per_1m_s = round(gpu_ms / 1000 / output * 1_000_000, 3) if output else None
    cost = None
    if output and gpu_second_cost_micros:
        cost = divide_half_up(gpu_ms * gpu_second_cost_micros * 1000, output)
    return {
        "deployment": deployment,
        "gpu_seconds": round(gpu_ms / 1000, 3),
        "completion_tokens": output,
        "gpu_seconds_per_1m_output_tokens": per_1m_s,
        "gpu_second_cost_micros": gpu_second_cost_micros,
        "gpu_cost_micros_per_1m_output_tokens": cost,
    }
