"""Reconcile: recompute the aggregates from the raw records and compare, field by field.

The raw streams are replayed up to the consumer's cursors with the booking rules the
consumer used (entries.py): GPU segments with the hour closes recorded between them on
their stream, token records in the hour of their stream id, each request id billed once.
Any difference between what is stored and what the raw records say is drift. Exported
hour files are checked too when an exporter is given: same bytes as recorded, same sums.
Hours whose raw token records were trimmed (closed, exported, past the retention) are
compared with their exported files only: the raw check covers the hours retained.
The stored GPU time's split by use (serving, loading, idle, asleep, wasted) must add up
to its metered `gpu_ms` in every hour, tenant and deployment (drift `where="split"`).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from ebb.billing.entries import METRICS, aggregate_field, book, hour_iso
from ebb.billing.export import S3HourExporter
from ebb.billing.gpu_costs import unsplit_gpu_ms
from ebb.queue.ledger import LedgerStore, RawRecord
from ebb.queue.metering import HourClosed

Aggregates = dict[int, dict[str, int]]


@dataclass(frozen=True)
class Drift:
    hour: str
    field: str
    stored: int
    recomputed: int
    where: str = "aggregates"  # or "s3", or "split" (stored: GPU ms by use, recomputed: metered)


@dataclass
class ReconcileReport:
    records: int = 0
    entries: int = 0
    hours: int = 0
    duplicate_request_ids: list[str] = field(default_factory=list)
    undecodable: list[str] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)
    exported_hours_checked: int = 0
    pending_exports: int = 0
    trimmed_before: str | None = None  # hours before this one: checked by their files only

    @property
    def ok(self) -> bool:
        return not self.drift and not self.undecodable

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, **asdict(self)}


async def reconcile(store: LedgerStore, exporter: S3HourExporter | None = None) -> ReconcileReport:
    snapshot = await store.view()
    state, stored = snapshot.state, snapshot.aggregates
    report = ReconcileReport(hours=len(stored))
    initial = await store.initial_closed_through_ms()
    recomputed: Aggregates = defaultdict(lambda: defaultdict(int))
    billed: set[str] = set()
    closed = initial
    async for raw in store.scan("gpu", state.gpu_cursor):
        if isinstance(raw.record, HourClosed):
            closed = raw.record.closed_through_ms
        _replay(raw, closed, recomputed, report, billed)
    async for raw in store.scan("usage", state.usage_cursor):
        _replay(raw, initial, recomputed, report, billed)
    trimmed_ms = await store.usage_trimmed_ms()
    if trimmed_ms:
        report.trimmed_before = hour_iso(trimmed_ms)
    report.drift = compare(_since(stored, trimmed_ms), _since(recomputed, trimmed_ms))
    report.drift += [
        Drift(hour_iso(hour), f"{who}|gpu_ms_by_use", used, gpu_ms, "split")
        for hour, who, used, gpu_ms in unsplit_gpu_ms(stored)
    ]
    report.pending_exports = len(await store.pending_exports())
    if exporter is not None:
        await _check_exports(store, exporter, stored, report)
    return report


def _replay(
    raw: RawRecord, closed_ms: int, into: Aggregates, report: ReconcileReport, billed: set[str]
) -> None:
    report.records += 1
    if raw.record is None:
        report.undecodable.append(f"{raw.stream}:{raw.entry_id}")
        return
    for entry in book(raw, closed_ms):
        if entry.request_id:
            if entry.request_id in billed:
                report.duplicate_request_ids.append(entry.request_id)
                continue
            billed.add(entry.request_id)
        report.entries += 1
        for name, n in entry.increments():
            into[entry.hour_ms][name] += n


def _since(aggregates: Aggregates, hour_ms: int) -> Aggregates:
    return {hour: counts for hour, counts in aggregates.items() if hour >= hour_ms}


def compare(stored: Aggregates, recomputed: Aggregates, where: str = "aggregates") -> list[Drift]:
    drift = []
    for hour in sorted(set(stored) | set(recomputed)):
        mine, theirs = stored.get(hour, {}), recomputed.get(hour, {})
        for name in sorted(set(mine) | set(theirs)):
            if mine.get(name, 0) != theirs.get(name, 0):
                drift.append(
                    Drift(hour_iso(hour), name, mine.get(name, 0), theirs.get(name, 0), where)
                )
    return drift


async def _check_exports(
    store: LedgerStore, exporter: S3HourExporter, stored: Aggregates, report: ReconcileReport
) -> None:
    for hour_ms, digest in sorted((await store.exported()).items()):
        body = await asyncio.to_thread(exporter.fetch, hour_ms)
        report.exported_hours_checked += 1
        if hashlib.sha256(body).hexdigest() != digest:
            report.drift.append(Drift(hour_iso(hour_ms), "sha256", 0, 1, "s3"))
        in_file = sum_lines(body.splitlines())
        report.drift += compare({hour_ms: stored.get(hour_ms, {})}, {hour_ms: in_file}, "s3")


def sum_lines(lines: list[bytes]) -> dict[str, int]:
    """The aggregates of one hour file, from its JSONL entries."""
    sums: dict[str, int] = defaultdict(int)
    for line in lines:
        entry = msgspec.json.decode(line)
        for metric in METRICS:
            if entry.get(metric):
                sums[aggregate_field(entry["tenant"], entry["deployment"], metric)] += entry[metric]
    return dict(sums)
