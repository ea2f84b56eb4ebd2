"""The ledger consumer: folds raw usage into hourly aggregates, closes hours, exports them.

Each step, in order:
  1. read the raw records after the cursors (waiting briefly when there are none);
  2. book them (entries.py) and fold the batch with its new cursors in one atomic step;
     a batch computed from a stale state is refused and simply re-read;
  3. when an hour is over (plus the grace), close it once all its records are folded;
  4. after a close, export closed hours to S3, oldest first, each exactly once;
  5. trim raw token records of hours closed (and exported, with export on) and older
     than the retention, so Redis does not grow with every request ever served.
Between steps it lingers a moment, so that under load one atomic fold takes many records.
Killing it at any instant loses nothing and double-counts nothing: what was not folded is
re-read from the cursors, and a half-done export is finished by the next run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

import msgspec

from ebb.billing.entries import DAY_MS, book, hour_floor, hour_iso
from ebb.billing.export import S3HourExporter
from ebb.queue.ledger import HOUR_MS, LedgerState, LedgerStore, RawRecord

log = logging.getLogger(__name__)

# Records folded per atomic step (per stream).
BATCH = 500
# After a step that found less than a batch, wait this long for more to fold at once.
LINGER_S = 0.25
# After a failed export, wait this long before the next try.
_EXPORT_RETRY_S = 30.0
# An hour that is not over yet by Redis's clock (this host's may differ): ask again after.
_CLOSE_RETRY_S = 1.0
# Raw token records are looked at for trimming at least this often (and after a close).
_TRIM_EVERY_S = 300.0


class LedgerConsumer:
    def __init__(
        self,
        store: LedgerStore,
        exporter: S3HourExporter | None = None,
        *,
        grace_s: float,
        batch: int = BATCH,
        linger_s: float = LINGER_S,
        usage_retention_s: float = 86400,
    ):
        self.store = store
        self.exporter = exporter
        self._grace_ms = int(grace_s * 1000)
        self._batch = batch
        self._linger_s = linger_s
        self._state: LedgerState | None = None  # None: read it from Redis
        self._next_close_s = 0.0
        self._next_export_s = 0.0
        self._retention_ms = int(usage_retention_s * 1000)
        self._next_trim_s = 0.0

    async def run(self, stop: asyncio.Event, block_ms: int = 1000) -> None:
        log.info("billing: ledger consumer up (export=%s)", self._describe_export())
        while not stop.is_set():
            try:
                if await self.step(block_ms) < self._batch:
                    # Under load, fold a few records per step rather than one step per record.
                    await asyncio.wait_for(stop.wait(), self._linger_s)
            except TimeoutError:
                pass
            except Exception:
                # Redis restarting or a bad record: log, breathe, and go on from the cursors.
                log.exception("billing: consumer step failed")
                self._state = None
                await asyncio.sleep(1.0)

    async def drain(self) -> None:
        """Burst mode: fold everything there is, close what is over, export; then return."""
        while await self.step(block_ms=0):
            pass

    async def step(self, block_ms: int = 0) -> int:
        """One pass; returns how many raw records it read."""
        state = self._state or await self._load_state()
        records = await self.store.read(state, self._batch, block_ms)
        if records:
            await self._fold(state, records)
        if time.time() >= self._next_close_s:
            await self._close_hours()
        if time.monotonic() >= self._next_export_s:
            await self._export_pending()
        if time.monotonic() >= self._next_trim_s:
            await self._trim_usage()
        return len(records)

    async def _load_state(self) -> LedgerState:
        state = await self.store.state()
        if state.closed_through_ms is None:
            # First start: close hours from the oldest record on (or from now, if none).
            first_ms = await self.store.first_entry_ms() or await self.store.redis_now_ms()
            await self.store.initialize(hour_floor(first_ms))
            state = await self.store.state()
        self._state = state
        return state

    async def _fold(self, state: LedgerState, records: list[RawRecord]) -> None:
        ops = []
        for raw in records:
            for entry in book(raw, state.closed_through_ms or 0):
                day = raw.entry_ms // DAY_MS
                ops.append(
                    {
                        "h": str(entry.hour_ms),
                        "id": entry.request_id,
                        "d": str(day),
                        "pd": str(day - 1),
                        "inc": [[name, str(n)] for name, n in entry.increments()],
                        "l": entry.line().decode(),
                    }
                )
        usage_cursor = _last_id(records, "usage") or state.usage_cursor
        gpu_cursor = _last_id(records, "gpu") or state.gpu_cursor
        result = await self.store.fold(state, usage_cursor, gpu_cursor, msgspec.json.encode(ops))
        if not result.applied:
            log.info("billing: ledger state moved (another consumer?); re-reading")
            self._state = None
            return
        self._state = replace(state, usage_cursor=usage_cursor, gpu_cursor=gpu_cursor)
        if result.duplicates:
            log.warning("billing: skipped %d already billed request(s)", result.duplicates)
        log.debug("billing: folded %d records into %d entries", len(records), result.folded)

    async def _close_hours(self) -> None:
        """Close every hour that is over; then rest until the next one could be."""
        while True:
            state = await self.store.state()
            outcome = await self.store.close_hour(
                state, grace_ms=self._grace_ms, export=self.exporter is not None
            )
            if outcome != "closed":
                break
            self._next_export_s = self._next_trim_s = 0.0
            log.info("billing: closed hour %s", hour_iso(state.closed_through_ms or 0))
        self._state = state
        if outcome == "early":
            # The local clock only says when to ask; the script decides on Redis's clock.
            due_ms = (state.closed_through_ms or 0) + HOUR_MS + self._grace_ms
            self._next_close_s = max(due_ms / 1000, time.time() + _CLOSE_RETRY_S)
        else:  # records still to fold first ('behind'), or another consumer ('conflict')
            self._next_close_s = 0.0

    async def _export_pending(self) -> None:
        self._next_export_s = float("inf")  # until an hour closes, or a failed export retries
        if self.exporter is None:
            return
        for hour_ms in await self.store.pending_exports():
            lines = await self.store.hour_lines(hour_ms)
            try:
                digest = await asyncio.to_thread(self.exporter.export, hour_ms, lines)
            except Exception:
                log.exception("billing: export of %s failed; retrying later", hour_iso(hour_ms))
                self._next_export_s = time.monotonic() + _EXPORT_RETRY_S
                return
            await self.store.mark_exported(hour_ms, digest)
            self._next_trim_s = 0.0

    async def _trim_usage(self) -> None:
        self._next_trim_s = time.monotonic() + _TRIM_EVERY_S
        wanted_ms = hour_floor(await self.store.redis_now_ms() - self._retention_ms)
        removed, boundary_ms = await self.store.trim_usage(wanted_ms)
        if removed:
            log.info(
                "billing: trimmed %d raw token records before %s", removed, hour_iso(boundary_ms)
            )

    def _describe_export(self) -> str:
        if self.exporter is None:
            return "off"
        return f"s3://{self.exporter.bucket}/{self.exporter.prefix}/"


def _last_id(records: list[RawRecord], stream: str) -> str | None:
    ids = [r.entry_id for r in records if r.stream == stream]
    return ids[-1] if ids else None
