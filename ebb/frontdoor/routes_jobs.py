"""Async jobs: submit them (POST /v1/jobs), and queue one for the Batch API (`create_job`).

A job is a chat, completions or embeddings request run without a client waiting: it is
checked and tokenized like a synchronous one (the same 400s), then queued in its deployment's job
queue with no admission window, only its TTL. Its result stays retrievable here for
EBB_JOB_RETENTION_S whether or not its webhook was delivered. A job whose deployment's
weights are still being prepared cannot be tokenized yet: it is accepted parked
(`waiting_for: weights_preparing`) and queued by `ebb.frontdoor.parked_jobs` once they
are ready.

Reading, listing and cancelling jobs: `routes_jobs_read`; the request body and what a job
is queued as: `job_requests`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Annotated

import msgspec
from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from ebb import tracing
from ebb.errors import CapacityError, Conflict, InvalidRequest
from ebb.frontdoor.adapters import JobTarget, adapter_job, job_target
from ebb.frontdoor.auth import RidingCallerDep
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.catalog import WEIGHTS_PREPARING
from ebb.frontdoor.job_requests import (
    UNPREPARED,
    JobCreate,
    QueuedJob,
    encode_parked,
    new_job_id,
    new_job_record,
    prepare_job,
)
from ebb.frontdoor.ratelimit import Reservation
from ebb.frontdoor.redis_down import ride_out
from ebb.frontdoor.routes_jobs_read import read_job_view
from ebb.frontdoor.services import Services, ServicesDep
from ebb.frontdoor.tenant_writes import require_tenant_write_room
from ebb.queue.job_store import IdempotencyConflict
from ebb.webhooks.signing import new_secret
from ebb.webhooks.ssrf import UnsafeUrl, resolve_target

router = APIRouter(prefix="/v1/jobs")


@router.post("", status_code=202)
async def submit_job(
    payload: JobCreate,
    request: Request,
    caller: RidingCallerDep,
    services: ServicesDep,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> JSONResponse:
    # A job's record is kept for days: a nearly full Redis keeps its room for platform state.
    await require_tenant_write_room(services, "jobs")
    if not tracing.active():
        return await _submit_riding_out(payload, caller, services, idempotency_key, None, 0)
    # The job's span continues the client's trace; the work item carries it to the runner
    # and the job's deliveries carry it to the webhooks worker, so one trace covers the
    # submission, every attempt and every webhook delivery.
    started_ns = time.time_ns()
    span = tracing.tracer.start_span(
        "ebb.job",
        context=tracing.context_from(request.headers),
        kind=SpanKind.SERVER,
        start_time=started_ns,
        attributes={"ebb.endpoint": "jobs", "ebb.model": payload.model},
    )
    try:
        response = await _submit_riding_out(
            payload, caller, services, idempotency_key, span, started_ns
        )
        span.set_attribute("http.response.status_code", response.status_code)
        return response
    finally:
        span.end()


async def _submit_riding_out(
    payload: JobCreate,
    caller: Caller,
    services: Services,
    idempotency_key: str | None,
    span: Span | None,
    started_ns: int,
) -> JSONResponse:
    """`_submit`, waiting out a short Redis outage (a restart) rather than refusing the
    job. A retry keeps the job id, so a submission applied before its reply was lost is
    answered, not made twice."""
    job_id = new_job_id()
    tries = 0

    async def submit() -> JSONResponse:
        nonlocal tries
        tries += 1
        if tries > 1 and await services.jobs.get(job_id) is not None:
            return JSONResponse(await read_job_view(services, job_id), status_code=202)
        return await _submit(
            payload, caller, services, idempotency_key, span, started_ns, job_id=job_id
        )

    return await ride_out(submit, services.settings.redis_outage_s)


async def _submit(
    payload: JobCreate,
    caller: Caller,
    services: Services,
    idempotency_key: str | None,
    span: Span | None,
    started_ns: int,
    *,
    job_id: str = "",
) -> JSONResponse:
    settings = services.settings
    ttl_s = payload.ttl_s or settings.job_ttl_s
    if ttl_s > settings.job_max_ttl_s:
        raise InvalidRequest(
            f"ttl_s must be at most {settings.job_max_ttl_s}; got {ttl_s}.", param="ttl_s"
        )
    target = await _deployment(services, caller, payload.model)
    spec = target.spec
    try:
        # No wait: weights still being prepared park the job rather than hold the client.
        prepared: QueuedJob | None = await prepare_job(services, spec, payload, 0.0)
    except CapacityError as e:
        if e.code != WEIGHTS_PREPARING:
            raise
        prepared = None
    if payload.webhook is not None:
        try:
            await resolve_target(payload.webhook.url, settings.webhook_allowed_networks)
        except UnsafeUrl as e:
            raise InvalidRequest(str(e), param="webhook.url", code="unsafe_webhook_url") from e
    # The tenant's signing secret exists before its first event, so it can be read first.
    await services.webhook_secrets.ensure(caller.tenant, new_secret())
    traceparent = tracing.traceparent_of(span) if span is not None else ""
    record = new_job_record(
        caller,
        spec,
        payload,
        prepared or UNPREPARED,
        settings.job_max_attempts,
        traceparent=traceparent,
        job_id=job_id,
    )
    record = adapter_job(record, target)
    record.work = await services.executor.stamp_priority(record.work)  # the caller's class
    submission = msgspec.json.encode(payload.model_dump(mode="json"), order="sorted")
    if prepared is None:
        # Parked: tokenized, reserved against the limits and queued by the parked-jobs
        # watcher once the weights are ready (ebb.frontdoor.parked_jobs).
        record.waiting_for = WEIGHTS_PREPARING
        record.submission = encode_parked(payload, caller)
        reservation = Reservation(None, record.work, 0)
    else:
        # The same limits as a synchronous request: reserved now, settled by the
        # collector when the job ends (429 here when the caller is over them).
        reservation = await services.limiter.reserve(caller, record.work)
    record.rate_reserved_tokens = reservation.reserved_tokens
    record.budget_reservation = reservation.budget_reservation
    try:
        job_id, replayed = await services.jobs.submit(
            record,
            ttl_s=ttl_s,
            idempotency_digest=_digest(idempotency_key.encode()) if idempotency_key else "",
            submission_digest=_digest(submission),
            parked=prepared is None,
        )
    except BaseException as e:
        await asyncio.shield(reservation.settle())  # nothing was queued: all of it back
        if not isinstance(e, IdempotencyConflict):
            raise
        raise Conflict(
            f"The Idempotency-Key was already used for a different submission (job "
            f"{e.job_id}). Reuse a key only to retry the same submission; send a new key "
            "for a new job.",
            code="idempotency_key_reused",
        ) from e
    if span is not None:
        span.set_attribute("ebb.job_id", job_id)
        admission = trace.set_span_in_context(span)
        # Arrival to enqueue, as for a synchronous request; the runner's queue wait follows.
        enqueued_ns = int(record.work.enqueued_at_s * 1e9)
        tracing.record_span("ebb.admission", admission, started_ns, enqueued_ns)
    headers = {"Location": f"/v1/jobs/{job_id}"}
    if replayed:  # the job queued the first time holds its own reservation
        await reservation.settle()
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(await read_job_view(services, job_id), status_code=202, headers=headers)


async def create_job(
    services: Services,
    caller: Caller,
    payload: JobCreate,
    *,
    batch: bool = False,
    idempotency: str = "",
    weights_wait_s: float | None = None,
) -> str:
    """Validate and queue one job as POST /v1/jobs would (no webhook); its id.

    With `batch` (the Batch API) token prices are reduced by the deployment's
    `serving.batch_discount_pct`. With `idempotency`, submitting it again returns the job
    already queued under it. Reserves against the caller's rate limits like POST /v1/jobs.
    Raises InvalidRequest when the request cannot run, RateLimited when it must wait,
    CapacityError (weights_preparing) when its weights are not ready within
    `weights_wait_s` (default: the deployment's admission window).
    """
    target = await _deployment(services, caller, payload.model)
    spec = target.spec
    prepared = await prepare_job(services, spec, payload, weights_wait_s)
    record = new_job_record(caller, spec, payload, prepared, services.settings.job_max_attempts)
    record = adapter_job(record, target)
    record.work = await services.executor.stamp_priority(record.work)  # the caller's class
    if batch and target.batch_discount_pct:
        keep = 100 - target.batch_discount_pct
        work = msgspec.structs.replace(
            record.work,
            price_per_1m_input_tokens_micros=record.work.price_per_1m_input_tokens_micros
            * keep
            // 100,
            price_per_1m_output_tokens_micros=record.work.price_per_1m_output_tokens_micros
            * keep
            // 100,
        )
        record = msgspec.structs.replace(record, work=work)
    # The caller's rate limits, as for POST /v1/jobs (RateLimited: the Batch API keeps the
    # line and queues it when the limits allow).
    reservation = await services.limiter.reserve(caller, record.work)
    record.rate_reserved_tokens = reservation.reserved_tokens
    record.budget_reservation = reservation.budget_reservation
    try:
        job_id, replayed = await services.jobs.submit(
            record,
            ttl_s=payload.ttl_s or services.settings.job_ttl_s,
            idempotency_digest=_digest(idempotency.encode()) if idempotency else "",
            submission_digest=_digest(idempotency.encode()) if idempotency else "",
        )
    except BaseException:
        await asyncio.shield(reservation.settle())  # nothing was queued: all of it back
        raise
    if replayed:  # the job queued the first time holds its own reservation
        await reservation.settle()
    return job_id


async def _deployment(services: Services, caller: Caller, model: str) -> JobTarget:
    # The job's attempts run on one version, picked by the traffic split (an adapter's
    # base's: ebb.frontdoor.adapters).
    return await job_target(services.state, caller, model)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
