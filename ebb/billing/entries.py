"""Booking: raw usage records become priced ledger entries in hourly buckets.

The same pure functions serve the consumer (which folds entries into the aggregates) and
reconcile (which recomputes the aggregates from the raw records), so both agree by
construction and any difference is real drift.

- A token record is one entry in the hour of its stream id (Redis's clock at finish).
  Only finished and cancelled requests are billed: a request that failed while running
  (the engine broke, or it was invalid for the engine) and one that was never admitted
  cost nothing.
- A GPU segment is cut at hour boundaries into one entry per hour it spans; each entry's
  `gpu_ms` is split by use (serving, loading, idle, asleep, wasted: `gpu_split.py`) in
  the segment's proportions, exactly, so the uses of every entry add up to its `gpu_ms`.
- An entry whose hour is already closed (`closed_through_ms`) is booked into the oldest
  open hour instead: a closed hour never changes, and nothing is lost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import msgspec

from ebb.billing.gpu_split import USE_METRICS, USES, allocate, use_metric
from ebb.billing.pricing import gpu_cost_micros, token_cost_micros
from ebb.queue.ledger import HOUR_MS, RawRecord
from ebb.queue.metering import GpuSegment
from ebb.queue.schema import UsageRecord

DAY_MS = 24 * HOUR_MS
BILLED_STATES = frozenset({"finished", "cancelled"})
METRICS = (
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "token_cost_micros",
    "gpu_ms",
    "gpu_cost_micros",
    *USE_METRICS,
)


def hour_floor(ms: int) -> int:
    return ms - ms % HOUR_MS


def hour_iso(hour_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:00:00Z", time.gmtime(hour_ms / 1000))


def aggregate_field(tenant: str, deployment: str, metric: str) -> str:
    # Tenant and deployment names cannot contain "|" (the APIs validate both).
    return f"{tenant}|{deployment}|{metric}"


def split_field(name: str) -> tuple[str, str, str]:
    tenant, deployment, metric = name.split("|")
    return tenant, deployment, metric


@dataclass(frozen=True)
class Entry:
    ledger_id: str  # "u:<stream id>" or "g:<stream id>:<piece>": unique and stable
    hour_ms: int
    tenant: str
    deployment: str
    request_id: str  # "" for GPU time
    counts: dict[str, int]
    detail: dict[str, object] = field(default_factory=dict)

    @property
    def cost_micros(self) -> int:
        return self.counts.get("token_cost_micros", 0) + self.counts.get("gpu_cost_micros", 0)

    def increments(self) -> list[tuple[str, int]]:
        return [
            (aggregate_field(self.tenant, self.deployment, metric), n)
            for metric, n in self.counts.items()
            if n
        ]

    def line(self) -> bytes:
        """The entry as one JSONL line of the hour's export file."""
        return msgspec.json.encode(
            {
                "ledger_id": self.ledger_id,
                "hour": hour_iso(self.hour_ms),
                "tenant": self.tenant,
                "deployment": self.deployment,
                **self.detail,
                **self.counts,
                "cost_micros": self.cost_micros,
            }
        )


def book(raw: RawRecord, closed_through_ms: int) -> list[Entry]:
    """The entries of one raw record (none for an unbilled request or a close marker)."""
    if isinstance(raw.record, UsageRecord):
        entry = book_usage(raw.entry_id, raw.entry_ms, raw.record, closed_through_ms)
        return [entry] if entry else []
    if isinstance(raw.record, GpuSegment):
        return book_gpu(raw.entry_id, raw.record, closed_through_ms)
    return []


def book_usage(
    entry_id: str, entry_ms: int, r: UsageRecord, closed_through_ms: int
) -> Entry | None:
    if r.state not in BILLED_STATES:
        return None
    cost = token_cost_micros(
        r.prompt_tokens,
        r.completion_tokens,
        r.price_per_1m_input_tokens_micros,
        r.price_per_1m_output_tokens_micros,
    )
    return Entry(
        ledger_id=f"u:{entry_id}",
        hour_ms=max(hour_floor(entry_ms), closed_through_ms),
        tenant=r.tenant,
        deployment=r.deployment,
        request_id=r.request_id,
        counts={
            "requests": 1,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            "token_cost_micros": cost,
        },
        detail={
            "kind": "tokens",
            "request_id": r.request_id,
            "key_id": r.key_id,
            "state": r.state,
            "runner_id": r.runner_id,
            "finished_ms": entry_ms,
            "price_per_1m_input_tokens_micros": r.price_per_1m_input_tokens_micros,
            "price_per_1m_output_tokens_micros": r.price_per_1m_output_tokens_micros,
        },
    )


def book_gpu(entry_id: str, seg: GpuSegment, closed_through_ms: int) -> list[Entry]:
    m = seg.meter
    entries: list[Entry] = []
    start = seg.start_ms
    while start < seg.end_ms:
        stop = min(seg.end_ms, hour_floor(start) + HOUR_MS)
        gpu_ms = (stop - start) * m.gpu_count
        entries.append(
            Entry(
                ledger_id=f"g:{entry_id}:{len(entries)}",
                hour_ms=max(hour_floor(start), closed_through_ms),
                tenant=m.tenant,
                deployment=m.deployment,
                request_id="",
                counts={
                    "gpu_ms": gpu_ms,
                    "gpu_cost_micros": gpu_cost_micros(gpu_ms, m.price_per_gpu_second_micros),
                    **gpu_uses(gpu_ms, seg.uses_ms),
                },
                detail={
                    "kind": "gpu",
                    "runner_id": m.runner_id,
                    "gpu_count": m.gpu_count,
                    "start_ms": start,
                    "end_ms": stop,
                    "price_per_gpu_second_micros": m.price_per_gpu_second_micros,
                },
            )
        )
        start = stop
    return entries


def gpu_uses(gpu_ms: int, uses_ms: dict[str, int] | None) -> dict[str, int]:
    """One entry's `gpu_ms` by use, as metrics: exactly `gpu_ms` in all (gpu_split.py)."""
    parts = allocate(gpu_ms, uses_ms or {})
    return {use_metric(u): parts[u] for u in USES}
