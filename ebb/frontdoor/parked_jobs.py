"""Parked jobs: accepted while their deployment's weights were being prepared, queued
once they are ready.

A job's request is tokenized before it is queued, and the tokenizer comes with the
prepared weights; a job submitted before they are ready is stored parked (`waiting_for:
weights_preparing`, its submission kept) instead of refused. Every frontdoor looks at the
parked jobs in the background: a job whose weights are now ready is checked, tokenized,
reserved against its caller's rate limits and queued as POST /v1/jobs would have (one
script, so two frontdoors never queue it twice); a job for which that fails for good
(weights that failed, a deleted deployment, a request the model refuses) fails at once
with that error; anything passing (still preparing, the rate limits, Redis restarting)
leaves it parked. The collector expires a job still parked at its TTL, naming what it
waited for.
"""

from __future__ import annotations

import asyncio
import logging

from ebb.errors import CapacityError, EbbError, RateLimited
from ebb.frontdoor.adapters import adapter_work, job_target
from ebb.frontdoor.job_requests import decode_parked, first_attempt, prepare_job
from ebb.frontdoor.services import Services
from ebb.queue.connection import UNAVAILABLE_ERRORS
from ebb.queue.job_schema import JobErrorInfo, JobStatus

log = logging.getLogger(__name__)

# Parked jobs looked at per pass; the rest wait for the next one.
_PASS_LIMIT = 200


async def watch_parked_jobs(services: Services, *, interval_s: float) -> None:
    """Queue parked jobs as soon as they can be, until cancelled."""
    while True:
        try:
            for job_id in await services.jobs.parked(_PASS_LIMIT):
                await queue_parked(services, job_id)
        except UNAVAILABLE_ERRORS as e:
            log.warning("jobs: Redis unavailable looking at parked jobs (%s); trying again", e)
        except Exception:  # the watcher must outlive any one job's trouble
            log.exception("jobs: looking at parked jobs failed; trying again")
        await asyncio.sleep(interval_s)


async def queue_parked(services: Services, job_id: str) -> str:
    """Queue parked job `job_id` if it can run now: 'queued', 'failed' (for good),
    'waiting' (still parked) or 'gone' (settled or queued meanwhile)."""
    record = await services.jobs.get(job_id)
    if record is None or record.status is not JobStatus.QUEUED or not record.submission:
        return "gone"
    payload, caller = decode_parked(record)
    try:
        target = await job_target(services.state, caller, payload.model)
        prepared = await prepare_job(services, target.spec, payload, 0.0)
        work = first_attempt(
            caller, target.spec, prepared, job_id, traceparent=record.work.traceparent
        )
        work = adapter_work(work, target)
        work = await services.executor.stamp_priority(work)
        reservation = await services.limiter.reserve(caller, work)
    except (CapacityError, RateLimited):
        return "waiting"
    except EbbError as e:
        log.info("jobs: parked %s cannot run: %s", job_id, e.message)
        error = JobErrorInfo(e.code, e.message)
        return "failed" if await services.jobs.fail_parked(job_id, error) else "gone"
    try:
        queued = await services.jobs.unpark(
            record,
            work,
            rate_reserved_tokens=reservation.reserved_tokens,
            budget_reservation=reservation.budget_reservation,
        )
    except BaseException:
        await asyncio.shield(reservation.settle())
        raise
    if not queued:
        await reservation.settle()  # another frontdoor queued it, or it settled
        return "gone"
    log.info("jobs: %s queued after waiting for %s", job_id, record.waiting_for)
    return "queued"
