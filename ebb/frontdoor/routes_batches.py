"""The Batch API on top of jobs: POST/GET /v1/batches, GET /v1/batches/{id}, cancel.

Each input line becomes a job (so it wakes a deployment at zero, yields to synchronous
traffic, survives restarts and is billed per token, at the deployment's batch discount);
a line the platform refuses goes to the error file without running. Lines count against
the key's and tenant's rate limits like jobs: a line over them stays pending, and the
watcher queues it (in file order) once the limits allow, within the completion window.
A line that meets a passing state of its deployment (weights being prepared) or of
Redis (restarting) waits the same way; only a permanent condition refuses it.
Creating a batch answers at once, `validating`: a file with no requests or more than
EBB_BATCH_MAX_LINES is a 400 then; its lines are validated and queued in the background
(ebb.frontdoor.batch_queueing), and a line that is not a request fails the batch, as
does one that cannot be queued (or resumed), once, with the reason in `errors`. Once
settled, a batch keeps its request counts and its jobs' records are let go within the
hour (the output and error files hold their results). A batch's status is
read through to its jobs whenever it is looked at; once all of them settled, the output
and error files are written (under fixed ids, so writing twice is harmless) and the batch
is completed, expired (some line waited past the completion window) or cancelled. The
frontdoor also looks at every unsettled batch in the background (`watch_batches`), so
that a batch with a webhook announces `batch.completed` (signed like job events) without
anyone polling it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
import uuid
from typing import Annotated, Any, Literal

import msgspec
from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from ebb.errors import InvalidRequest, NotFound
from ebb.frontdoor.auth import CallerDep, RidingCallerDep
from ebb.frontdoor.batch_queueing import is_queueing_here, queue_pending, start_queueing
from ebb.frontdoor.batches import (
    COMPLETION_WINDOWS,
    batch_view,
    check_line_count,
    counts,
    output_files,
)
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.file_keeping import store_file
from ebb.frontdoor.list_page import list_page
from ebb.frontdoor.redis_down import ride_out
from ebb.frontdoor.routes_files import owned_file
from ebb.frontdoor.services import Services, ServicesDep
from ebb.frontdoor.tenant_writes import require_tenant_write_room
from ebb.queue.batch_store import BatchRecord, BatchStatus
from ebb.queue.job_schema import JobRecord, JobStatus
from ebb.webhooks.signing import new_secret
from ebb.webhooks.ssrf import UnsafeUrl, resolve_target

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/batches")

_LIST_SCAN = 100
# How long a settled batch's jobs stay retrievable by GET /v1/jobs/{id} (the batch, its
# output and error files stay for their own retention).
_SETTLED_JOB_KEEP_S = 3600


class BatchWebhook(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2048)


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(min_length=1)
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]
    completion_window: Literal["24h"]
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] = (
        Field(default_factory=dict, max_length=16)
    )
    # An ebb extension (the SDK's extra_body): where batch.completed is delivered.
    webhook: BatchWebhook | None = None


@router.post("")
async def create_batch(
    payload: BatchCreate, caller: RidingCallerDep, services: ServicesDep
) -> dict[str, Any]:
    """Store the batch `validating` and answer: its lines are validated and queued in the
    background (ebb.frontdoor.batch_queueing), however many there are."""
    info = await owned_file(services.files, payload.input_file_id, caller)
    if info.purpose != "batch":
        raise InvalidRequest("input_file_id must name a file uploaded with purpose batch.")
    content = await asyncio.to_thread(services.files.content, info.file_id)
    await asyncio.to_thread(check_line_count, content, services.settings.batch_max_lines)
    if payload.webhook is not None:
        try:
            await resolve_target(payload.webhook.url, services.settings.webhook_allowed_networks)
        except UnsafeUrl as e:
            raise InvalidRequest(str(e), param="webhook.url", code="unsafe_webhook_url") from e
        await services.webhook_secrets.ensure(caller.tenant, new_secret())
    now = int(time.time())
    window_s = COMPLETION_WINDOWS[payload.completion_window]
    record = BatchRecord(
        batch_id=f"batch_{now * 1000:012x}{uuid.uuid4().hex[:12]}",
        tenant=caller.tenant,
        key_id=caller.key_id,
        endpoint=payload.endpoint,
        input_file_id=info.file_id,
        completion_window=payload.completion_window,
        created_at_s=now,
        expires_at_s=now + window_s,
        status=BatchStatus.VALIDATING,
        metadata=payload.metadata,
        webhook_url=payload.webhook.url if payload.webhook else "",
    )
    # Before the batch (and, in the background, its jobs) are written: a nearly full
    # Redis keeps its room for platform state.
    await require_tenant_write_room(services, "batches")
    # Stored, and its lease taken, before any line is queued: if this process dies while
    # queueing, the lease lapses and a batch watcher queues the rest. A Redis restart is
    # waited out (creating the same record again changes nothing); the lines then wait
    # out anything passing (batch_queueing._queue_line).
    outage_s = services.settings.redis_outage_s
    await ride_out(lambda: services.batches.create(record), outage_s)
    ttl_s = services.settings.batch_resume_after_s
    await ride_out(
        lambda: services.batches.hold_work(record.batch_id, services.instance, ttl_s=ttl_s),
        outage_s,
    )
    start_queueing(services, record, caller, content)
    return batch_view(record, counts(record, {}))


@router.get("/{batch_id}")
async def retrieve_batch(batch_id: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    return await _refreshed_view(services, await _owned(services, batch_id, caller))


@router.get("")
async def list_batches(
    caller: CallerDep,
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
) -> dict[str, Any]:
    """The caller's batches, newest first; `after` is the previous page's last id."""
    ids = await services.batches.tenant_batch_ids(caller.tenant, before=after, count=limit + 1)
    found = []
    for batch_id in ids:
        record = await services.batches.get(batch_id)
        if record is not None:
            found.append(await _refreshed_view(services, record))
    return list_page(found, limit)


@router.post("/{batch_id}/cancel")
async def cancel_batch(batch_id: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    """Queued lines never run; running ones are aborted (billed for what they made)."""
    record = await _owned(services, batch_id, caller)
    if not record.status.is_terminal and record.status is not BatchStatus.CANCELLING:
        record.status = BatchStatus.CANCELLING  # a validating batch cancels once queued
        record.cancelling_at_s = int(time.time())
        await services.batches.put(record)
        for line in record.lines:
            if line.job_id:
                await services.jobs.cancel(line.job_id)
    return await _refreshed_view(services, record)


async def _owned(services: Services, batch_id: str, caller: Caller) -> BatchRecord:
    record = await services.batches.get(batch_id)
    if record is None or (record.tenant != caller.tenant and not caller.is_admin):
        raise NotFound(f"No batch {batch_id!r}. GET /v1/batches lists yours.", param="batch_id")
    return record


async def _refreshed_view(services: Services, record: BatchRecord) -> dict[str, Any]:
    if record.status.is_terminal and record.final_counts is not None:
        return batch_view(record, record.final_counts)  # its jobs may be gone by now
    jobs = await _jobs(services, record)
    # In progress, it settles once every line is queued; cancelling, its pending lines
    # never will be.
    pending = any(line.pending for line in record.lines)
    queued = bool(record.lines) and (
        record.status is BatchStatus.CANCELLING
        or (record.status is BatchStatus.IN_PROGRESS and not pending)
    )
    if queued and all(j is None or j.status.is_terminal for j in jobs.values()):
        await _finalize(services, record, jobs)
    return batch_view(record, counts(record, jobs))


async def _jobs(services: Services, record: BatchRecord) -> dict[str, JobRecord | None]:
    ids = [line.job_id for line in record.lines if line.job_id]
    found: dict[str, JobRecord | None] = {}
    for start in range(0, len(ids), _LIST_SCAN):
        chunk = ids[start : start + _LIST_SCAN]
        found.update(zip(chunk, await services.jobs.get_many(chunk), strict=True))
    return found


async def _finalize(
    services: Services, record: BatchRecord, jobs: dict[str, JobRecord | None]
) -> None:
    """Write the output and error files and settle the batch; safe to run twice."""
    unqueued = {"code": "batch_cancelled", "message": "The batch was cancelled first."}
    record.lines = [
        msgspec.structs.replace(line, error=unqueued) if line.pending else line
        for line in record.lines
    ]
    outputs, errors = output_files(record, jobs)
    for kind, lines in (("output", outputs), ("errors", errors)):
        if not lines:
            continue
        info = await store_file(
            services,
            ("\n".join(lines) + "\n").encode(),
            tenant=record.tenant,
            filename=f"{record.batch_id}_{kind}.jsonl",
            purpose="batch_output",
            file_id=f"file-{record.batch_id}-{kind}",
            platform_written=True,
        )
        if kind == "output":
            record.output_file_id = info.file_id
        else:
            record.error_file_id = info.file_id
    now = int(time.time())
    expired = any(j is not None and j.status is JobStatus.EXPIRED for j in jobs.values()) or any(
        line.error is not None and line.error.get("code") == _UNQUEUED_EXPIRED
        for line in record.lines
    )
    if record.status is BatchStatus.CANCELLING:
        record.status, record.cancelled_at_s = BatchStatus.CANCELLED, now
    elif expired:
        record.status, record.expired_at_s = BatchStatus.EXPIRED, now
    else:
        record.status, record.completed_at_s = BatchStatus.COMPLETED, now
    record.finalizing_at_s = record.finalizing_at_s or now
    record.final_counts = counts(record, jobs)
    body = {
        "type": "batch.completed",
        "timestamp": dt.datetime.fromtimestamp(now, tz=dt.UTC).isoformat().replace("+00:00", "Z"),
        "data": batch_view(record, record.final_counts),
    }
    webhook_id = f"msg_{uuid.uuid4().hex}"
    if await services.batches.settle(record, webhook_id=webhook_id, body=_json(body)):
        log.info("batches: %s %s, batch.completed announced", record.batch_id, record.status)
    # What each line keeps in Redis ends with its batch (bar an hour for GET /v1/jobs).
    job_ids = [line.job_id for line in record.lines if line.job_id]
    for start in range(0, len(job_ids), _LIST_SCAN):
        chunk = job_ids[start : start + _LIST_SCAN]
        await services.jobs.shorten_retention(chunk, keep_s=_SETTLED_JOB_KEEP_S)


def _json(body: dict[str, Any]) -> str:
    return msgspec.json.encode(body).decode()


async def watch_batches(
    services: Services, *, interval_s: float, resume_after_s: float = 30.0
) -> None:
    """Settle batches whose jobs have all settled, queue the lines of batches whose
    creation was interrupted (validating for over `resume_after_s`) and the pending lines
    the rate limits now allow, until cancelled."""
    while True:
        for batch_id in await services.batches.active_ids():
            try:
                await _look_at(services, batch_id, resume_after_s)
            except Exception:  # one batch's trouble must not stop the others'
                log.exception("batches: looking at %s failed; trying again", batch_id)
        await asyncio.sleep(interval_s)


async def _look_at(services: Services, batch_id: str, resume_after_s: float) -> None:
    record = await services.batches.get(batch_id)
    now = time.time()
    if record is None or record.status.is_terminal:
        await services.batches.forget_active(batch_id)
    elif record.status is BatchStatus.VALIDATING or not record.lines:
        await _resume_if_abandoned(services, record, now - record.created_at_s > resume_after_s)
    elif record.status is BatchStatus.IN_PROGRESS and any(x.pending for x in record.lines):
        if now > record.expires_at_s:
            await _expire_pending(services, record)
        elif now >= record.release_at_s:
            await queue_pending(services, record)
    else:
        await _refreshed_view(services, record)


async def _resume_if_abandoned(services: Services, record: BatchRecord, old: bool) -> None:
    """Queue the lines of a batch whose queueing frontdoor died (its lease lapsed)."""
    if not old or is_queueing_here(record.batch_id):
        return
    ttl_s = services.settings.batch_resume_after_s
    if await services.batches.hold_work(record.batch_id, services.instance, ttl_s=ttl_s):
        log.info("batches: resuming %s, interrupted while its lines were queued", record.batch_id)
        caller = Caller(tenant=record.tenant, key_id=record.key_id, is_admin=False)
        start_queueing(services, record, caller)


# The code of a pending line whose completion window passed before it could be queued.
_UNQUEUED_EXPIRED = "batch_expired"


async def _expire_pending(services: Services, record: BatchRecord) -> None:
    """Fail the lines still pending when the completion window ended, naming what they
    waited for."""
    waited_for = record.waiting_for or "rate_limits"
    expired = {
        "code": _UNQUEUED_EXPIRED,
        "message": "The request was not queued within the completion window: it waited "
        f"for {waited_for}.",
    }
    record.lines = [
        msgspec.structs.replace(line, error=expired) if line.pending else line
        for line in record.lines
    ]
    await services.batches.put(record)
    await _refreshed_view(services, record)
