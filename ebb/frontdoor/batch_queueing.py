"""Queueing a batch's lines as jobs, in the background of `POST /v1/batches`.

The route stores the batch `validating` and answers at once; a task of the same frontdoor
then reads the input file, validates every line (one that fails fails the batch, with
OpenAI's `errors`) and queues one job per line, after which the batch is `in_progress`.
The task holds a lease in Redis (renewed as it goes, EBB_BATCH_RESUME_AFTER_S long): if
its frontdoor dies, the lease lapses and the first batch watcher to look (any frontdoor)
takes it and queues the rest. Each job has an idempotency key of (batch, custom_id), so
queueing a batch again returns the jobs already queued: none runs twice, none is lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from ebb.errors import CapacityError, EbbError, RateLimited
from ebb.frontdoor.batches import (
    COMPLETION_WINDOWS,
    ENDPOINTS,
    InputLine,
    InvalidInput,
    parse_input,
)
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.job_requests import JobCreate
from ebb.frontdoor.routes_jobs import create_job
from ebb.frontdoor.services import Services
from ebb.queue.batch_store import BatchLine, BatchRecord, BatchStatus
from ebb.queue.connection import UNAVAILABLE_ERRORS

log = logging.getLogger(__name__)

# The batches this frontdoor is queueing now (a strong reference keeps each task alive).
_RUNNING: dict[str, asyncio.Task[None]] = {}


def is_queueing_here(batch_id: str) -> bool:
    return batch_id in _RUNNING


def start_queueing(
    services: Services, record: BatchRecord, caller: Caller, content: bytes | None = None
) -> None:
    """Validate and queue `record`'s lines in a task of this process; the caller holds
    the batch's lease (BatchStore.hold_work). `content`: the input file, if read."""
    task = asyncio.create_task(_validate_and_queue(services, record, caller, content))
    _RUNNING[record.batch_id] = task
    task.add_done_callback(lambda _: _RUNNING.pop(record.batch_id, None))


async def stop_queueing() -> None:
    """Cancel this process's queueing tasks (it is stopping): their leases lapse and a
    watcher of a frontdoor still running (or this one, restarted) takes them over."""
    tasks = list(_RUNNING.values())
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class _LeaseLost(Exception):
    """Another frontdoor took the batch over (this one stalled past its lease)."""


async def _validate_and_queue(
    services: Services, record: BatchRecord, caller: Caller, content: bytes | None
) -> None:
    try:
        if content is None:
            content = await asyncio.to_thread(services.files.content, record.input_file_id)
        inputs = await asyncio.to_thread(_parse, services, content, record.endpoint)
    except (InvalidInput, FileNotFoundError) as e:
        await give_up(services, record, not_queued(e))
        return
    except Exception:  # Redis or the object store unreachable: the lease lapses, retried
        log.exception("batches: %s could not be read; a watcher tries again", record.batch_id)
        return
    try:
        await queue_lines(services, record, inputs, caller, lease=True)
    except _LeaseLost:
        log.warning("batches: %s was taken over by another frontdoor", record.batch_id)
    except Exception as e:
        log.exception("batches: %s could not be queued", record.batch_id)
        await give_up(services, record, not_queued(e))


def _parse(services: Services, content: bytes, endpoint: str) -> list[InputLine]:
    settings = services.settings
    return parse_input(
        content,
        endpoint,
        max_lines=settings.batch_max_lines,
        max_line_bytes=settings.max_body_bytes,
    )


class _Lease:
    """Renews the batch's lease a few times per its length, and says when it was
    cancelled meanwhile (the queueing then stops: what is queued is cancelled)."""

    def __init__(self, services: Services, batch_id: str):
        self._services = services
        self._batch_id = batch_id
        self._ttl_s = services.settings.batch_resume_after_s
        self._renewed = float("-inf")  # the first line looks (a resumed batch may be cancelled)

    async def keep(self) -> bool:
        """Renew when due; False once the batch is being cancelled."""
        if time.monotonic() - self._renewed < self._ttl_s / 3:
            return True
        batches = self._services.batches
        if not await batches.hold_work(self._batch_id, self._services.instance, ttl_s=self._ttl_s):
            raise _LeaseLost(self._batch_id)
        self._renewed = time.monotonic()
        current = await batches.get(self._batch_id)
        return current is not None and current.status is BatchStatus.VALIDATING


async def queue_lines(
    services: Services,
    record: BatchRecord,
    inputs: list[InputLine],
    caller: Caller,
    *,
    lease: bool = False,
) -> BatchRecord:
    """One job per line not queued yet, in file order until the caller's rate limits
    refuse one (that one and the rest stay pending, tried again at `release_at_s`).
    `lease`: the batch is validating and this process holds its lease (renewed here)."""
    window_s = COMPLETION_WINDOWS[record.completion_window]
    settled = {line.custom_id: line for line in record.lines if not line.pending}
    lines: list[BatchLine] = []
    wait: _Wait | None = None
    holder = _Lease(services, record.batch_id) if lease else None
    stopped = False
    for item in inputs:
        line = settled.get(item.custom_id)
        if holder is not None and not stopped:
            stopped = not await holder.keep()
        if line is None and wait is None and not stopped:
            line, wait = await _queue_line(services, record, item, caller, window_s)
        lines.append(line or BatchLine(item.custom_id))
    current = await services.batches.get(record.batch_id) or record
    current.lines = lines
    current.release_at_s = time.time() + wait.wait_s if wait is not None else 0.0
    current.waiting_for = wait.reason if wait is not None else ""
    if current.status is BatchStatus.VALIDATING:
        current.status, current.in_progress_at_s = BatchStatus.IN_PROGRESS, int(time.time())
    await services.batches.put(current)
    if current.status is BatchStatus.CANCELLING:  # cancelled while its lines were queued
        for line in lines:
            if line.job_id:
                await services.jobs.cancel(line.job_id)
    return current


@dataclass(frozen=True)
class _Wait:
    """Why a line was not queued yet, and when to try it again."""

    wait_s: float
    reason: str  # "rate_limits" or the passing state's code ("weights_preparing", ...)


# While Redis is unreachable (restarting), pending lines are tried again this often.
_REDIS_RETRY_S = 1.0


async def _queue_line(
    services: Services, record: BatchRecord, item: InputLine, caller: Caller, window_s: int
) -> tuple[BatchLine | None, _Wait | None]:
    """(the line queued or refused, None) or (None, why and how long it must wait).

    Only what the line itself gets wrong, or what will not pass (weights that failed, a
    deleted deployment), refuses it; a passing state (its rate limits, weights being
    prepared, Redis restarting) keeps it pending within the completion window."""
    job = JobCreate(
        model=str(item.body["model"]),
        endpoint=ENDPOINTS[record.endpoint],  # type: ignore[arg-type]
        body=item.body,
        metadata={"batch_id": record.batch_id, "custom_id": item.custom_id[:512]},
        ttl_s=window_s,
    )
    key = f"{record.batch_id}|{item.custom_id}"
    try:
        job_id = await create_job(
            services, caller, job, batch=True, idempotency=key, weights_wait_s=0.0
        )
    except RateLimited as e:
        return None, _Wait(e.retry_after_s, "rate_limits")
    except CapacityError as e:
        return None, _Wait(e.retry_after_s, e.code)
    except UNAVAILABLE_ERRORS:
        log.warning("batches: Redis unavailable queueing %s; trying again", record.batch_id)
        return None, _Wait(_REDIS_RETRY_S, "redis_unavailable")
    except EbbError as e:
        # Refused before running, as OpenAI reports a request that failed validation.
        return BatchLine(item.custom_id, error={"code": e.code, "message": e.message}), None
    return BatchLine(item.custom_id, job_id), None


async def queue_pending(services: Services, record: BatchRecord) -> None:
    """Queue the pending lines its rate limits now allow (an input that no longer
    validates, or was deleted, fails the batch; other errors are tried again next time)."""
    try:
        content = await asyncio.to_thread(services.files.content, record.input_file_id)
        inputs = await asyncio.to_thread(_parse, services, content, record.endpoint)
    except (InvalidInput, FileNotFoundError) as e:
        await give_up(services, record, not_queued(e))
        return
    caller = Caller(tenant=record.tenant, key_id=record.key_id, is_admin=False)
    await queue_lines(services, record, inputs, caller)


def not_queued(e: Exception) -> dict[str, Any]:
    """`e` as an entry of the batch's `errors`."""
    if isinstance(e, InvalidInput):
        return e.batch_error()
    if isinstance(e, FileNotFoundError):
        message = "The batch's input file is gone; upload it again and create a new batch."
        return {"code": "input_file_missing", "message": message, "param": None, "line": None}
    message = f"The batch's lines could not be queued ({type(e).__name__}); create it again."
    return {"code": "batch_not_queued", "message": message, "param": None, "line": None}


async def give_up(services: Services, record: BatchRecord, error: dict[str, Any]) -> BatchRecord:
    """Settle a batch that cannot be queued: failed (cancelled, if it was being
    cancelled) with `error`, its queued jobs cancelled, and no longer watched."""
    current = await services.batches.get(record.batch_id) or record
    now = int(time.time())
    if current.status is BatchStatus.CANCELLING:
        current.status, current.cancelled_at_s = BatchStatus.CANCELLED, now
    else:
        current.status, current.failed_at_s = BatchStatus.FAILED, now
    current.errors = [error]
    for line in current.lines:
        if line.job_id:
            await services.jobs.cancel(line.job_id)
    await services.batches.put(current)
    await services.batches.forget_active(current.batch_id)
    return current
