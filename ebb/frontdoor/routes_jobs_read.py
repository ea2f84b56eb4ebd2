"""Jobs already submitted: read (GET /v1/jobs/{id}), list (GET /v1/jobs) and cancel
(DELETE /v1/jobs/{id}) them. Submission is `routes_jobs`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query

from ebb.errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from ebb.frontdoor.auth import CallerDep
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.list_page import list_page
from ebb.frontdoor.routes_limits import TENANT_PATTERN
from ebb.frontdoor.services import Services, ServicesDep
from ebb.queue.deployment_condition import waiting_for
from ebb.queue.job_schema import JobRecord, JobStatus
from ebb.queue.job_store import JobStore
from ebb.webhooks.job_budgets import settle_job_budget
from ebb.webhooks.job_limits import give_back_unused
from ebb.webhooks.views import current_status, job_view

router = APIRouter(prefix="/v1/jobs")

# DELETE on a running job waits this long for the runner to abort it, so that the answer
# usually shows the job cancelled (and what it was billed).
_CANCEL_WAIT_S = 5.0
_LIST_SCAN_BATCH = 100


@router.get("")
async def list_jobs(
    caller: CallerDep,
    services: ServicesDep,
    status: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
    model: str | None = None,
    tenant: Annotated[str | None, Query(pattern=TENANT_PATTERN)] = None,
) -> dict[str, Any]:
    """The caller's jobs (the admin: `tenant`'s), newest first, optionally only those of
    one `model` or `status`; `after` is the last id of the previous page."""
    if status is not None and status not in JobStatus.__members__.values():
        raise InvalidRequest(
            f"status must be one of {', '.join(JobStatus)}; got {status!r}.", param="status"
        )
    if tenant is not None and tenant != caller.tenant and not caller.is_admin:
        raise PermissionDenied("A tenant key lists its own jobs only; leave tenant out.")
    whose = tenant or caller.tenant
    jobs = services.jobs
    found: list[dict[str, Any]] = []
    cursor = after
    while len(found) <= limit:
        ids = await jobs.tenant_job_ids(whose, before=cursor, count=_LIST_SCAN_BATCH)
        if not ids:
            break
        cursor = ids[-1]
        records = await jobs.get_many(ids)
        gone = [i for i, r in zip(ids, records, strict=True) if r is None]
        await jobs.forget_listed(whose, gone)
        live = [r for r in records if r is not None and model in (None, r.deployment)]
        states = await jobs.attempt_states([r.request_id for r in live])
        for record, state in zip(live, states, strict=True):
            current = current_status(record, state)
            if status is None or current == status:
                found.append(job_view(record, status=current))
    return list_page(found, limit)


@router.get("/{job_id}")
async def get_job(job_id: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    await _owned(services.jobs, job_id, caller)
    return await read_job_view(services, job_id)


@router.delete("/{job_id}")
async def cancel_job(job_id: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    """Queued: removed, never runs. Running: aborted in the engine, billed for what it
    generated (the answer shows it settled unless that takes over 5 s). Settled: 409."""
    record = await _owned(services.jobs, job_id, caller)
    outcome = await services.jobs.cancel(job_id)
    if outcome == "withdrawn":  # never ran, and the collector never sees it settle
        await give_back_unused(services.ratelimits, record, ran=False)
        await settle_job_budget(services.budgets, record, ran=False)
    if outcome in JobStatus.__members__.values():
        raise Conflict(
            f"Job {job_id} already {outcome}; there is nothing to cancel.", code="job_settled"
        )
    deadline = time.monotonic() + _CANCEL_WAIT_S
    while outcome != "withdrawn" and time.monotonic() < deadline:
        current = await services.jobs.get(job_id)
        if current is None or current.status.is_terminal:
            break
        await asyncio.sleep(0.05)
    return await read_job_view(services, job_id)


async def _owned(jobs: JobStore, job_id: str, caller: Caller) -> JobRecord:
    record = await jobs.get(job_id)
    if record is None or (record.tenant != caller.tenant and not caller.is_admin):
        raise NotFound(f"No job {job_id!r}. GET /v1/jobs lists yours.", param="job_id")
    return record


async def read_job_view(services: Services, job_id: str) -> dict[str, Any]:
    record = await services.jobs.get(job_id)
    if record is None:
        raise NotFound(f"No job {job_id!r}; it has expired.", param="job_id")
    state = None
    if not record.status.is_terminal:
        state = (await services.jobs.attempt_state(record.request_id)).get("state")
    status = current_status(record, state)
    if status is JobStatus.QUEUED and not record.waiting_for:
        # Queued, it waits on its deployment: show on what, if anything passing.
        deployment_status = await services.state.deployment_status(record.work.deployment)
        record.waiting_for = waiting_for(deployment_status)
    return job_view(record, status=status, deliveries=await services.deliveries.for_job(job_id))
