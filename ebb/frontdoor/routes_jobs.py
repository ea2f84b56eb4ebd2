"""Async jobs: submit (POST), read (GET), list (GET) and cancel (DELETE) /v1/jobs.

A job is a chat, completions or embeddings request run without a client waiting: it is
checked and tokenized like a synchronous one (the same 400s), then queued in its deployment's job
queue with no admission window, only its TTL. Its result stays retrievable here for
EBB_JOB_RETENTION_S whether or not its webhook was delivered. A job whose deployment's
weights are still being prepared cannot be tokenized yet: it is accepted parked
(`waiting_for: weights_preparing`) and queued by `ebb.frontdoor.parked_jobs` once they
are ready.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from ebb import tracing
from ebb.errors import CapacityError, Conflict, InvalidRequest, NotFound, PermissionDenied
from ebb.frontdoor.adapters import JobTarget, adapter_job, job_target
from ebb.frontdoor.auth import CallerDep, RidingCallerDep
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.catalog import WEIGHTS_PREPARING
from ebb.frontdoor.ratelimit import Reservation
from ebb.frontdoor.redis_down import ride_out
from ebb.frontdoor.routes_embeddings import (
    job_work,
    parse_embedding_request,
    require_embedding,
    tokenize_inputs,
)
from ebb.frontdoor.routes_limits import TENANT_PATTERN
from ebb.frontdoor.services import Services, ServicesDep
from ebb.openai.response_builder import CHAT_ENDPOINT, EMBEDDINGS_ENDPOINT
from ebb.openai.schema import parse_chat_request, parse_completion_request
from ebb.openai.translate import Prepared, prepare_chat, prepare_completion, require_generative
from ebb.queue.deployment_condition import waiting_for
from ebb.queue.job_schema import JobEvent, JobRecord, JobStatus, attempt_request_id
from ebb.queue.job_store import IdempotencyConflict, JobStore
from ebb.queue.schema import DeploymentSpec, SamplingSpec, ToolCallFormat, WorkItem
from ebb.queue.versions import public_name
from ebb.webhooks.job_budgets import settle_job_budget
from ebb.webhooks.job_limits import give_back_unused
from ebb.webhooks.signing import new_secret
from ebb.webhooks.ssrf import UnsafeUrl, resolve_target
from ebb.webhooks.views import current_status, job_view

router = APIRouter(prefix="/v1/jobs")

# DELETE on a running job waits this long for the runner to abort it, so that the answer
# usually shows the job cancelled (and what it was billed).
_CANCEL_WAIT_S = 5.0
_LIST_SCAN_BATCH = 100

MetadataValue = Annotated[str, StringConstraints(max_length=512)]


def job_events() -> list[JobEvent]:
    """The events a job's webhook can subscribe to (batch.completed is a batch's, and
    budget.soft_limit_reached a tenant's)."""
    return [e for e in JobEvent if e.startswith("job.")]


class WebhookSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2048)
    # null (as SDKs send an unset field) means every job event.
    events: list[JobEvent] | None = Field(default_factory=lambda: job_events(), min_length=1)


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    endpoint: Literal["chat.completions", "completions", "embeddings"]
    body: dict[str, Any]
    webhook: WebhookSpec | None = None
    metadata: dict[Annotated[str, StringConstraints(max_length=64)], MetadataValue] | None = Field(
        default_factory=dict, max_length=16
    )
    ttl_s: int | None = Field(default=None, ge=1)


def new_job_id() -> str:
    # Ids sort by creation time, which the tenant listing's cursor relies on.
    return f"job_{int(time.time() * 1000):012x}{uuid.uuid4().hex[:12]}"


@router.post("", status_code=202)
async def submit_job(
    payload: JobCreate,
    request: Request,
    caller: RidingCallerDep,
    services: ServicesDep,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> JSONResponse:
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
            return JSONResponse(await _view(services, job_id), status_code=202)
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
        prepared: _Queued | None = await prepare_job(services, spec, payload, 0.0)
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
    record = _new_record(
        caller,
        spec,
        payload,
        prepared or _UNPREPARED,
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
    return JSONResponse(await _view(services, job_id), status_code=202, headers=headers)


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
    record = _new_record(caller, spec, payload, prepared, services.settings.job_max_attempts)
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
    page = found[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(found) > limit,
    }


@router.get("/{job_id}")
async def get_job(job_id: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    await _owned(services.jobs, job_id, caller)
    return await _view(services, job_id)


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
    return await _view(services, job_id)


async def _owned(jobs: JobStore, job_id: str, caller: Caller) -> JobRecord:
    record = await jobs.get(job_id)
    if record is None or (record.tenant != caller.tenant and not caller.is_admin):
        raise NotFound(f"No job {job_id!r}. GET /v1/jobs lists yours.", param="job_id")
    return record


async def _view(services: Services, job_id: str) -> dict[str, Any]:
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


async def _deployment(services: Services, caller: Caller, model: str) -> JobTarget:
    # The job's attempts run on one version, picked by the traffic split (an adapter's
    # base's: ebb.frontdoor.adapters).
    return await job_target(services.state, caller, model)


@dataclass(frozen=True)
class _Queued:
    """What a job's work item carries, and what its result needs to know."""

    prompt_token_ids: list[int]
    sampling: SamplingSpec
    tools: ToolCallFormat | None = None
    encoding_format: str = "float"  # embeddings: how the result writes vectors


async def prepare_job(
    services: Services,
    spec: DeploymentSpec,
    payload: JobCreate,
    weights_wait_s: float | None = None,
) -> _Queued:
    """Check and tokenize the job's request exactly as the synchronous endpoint would,
    waiting `weights_wait_s` (default: the admission window) for weights being prepared."""
    body = dict(payload.body)
    if body.setdefault("model", payload.model) != payload.model:
        raise InvalidRequest(
            f"body.model ({body['model']!r}) differs from model ({payload.model!r}); "
            "leave it out of body.",
            param="body.model",
        )
    if body.get("stream"):
        raise InvalidRequest(
            "A job's result is delivered whole (GET /v1/jobs/{id} and its webhook); "
            "remove stream from body.",
            param="body.stream",
        )
    window_s = weights_wait_s
    if window_s is None:
        window_s = spec.admission_timeout_s or services.settings.admission_timeout_s
    if payload.endpoint == EMBEDDINGS_ENDPOINT:
        return await _prepare_embeddings(services, spec, body, window_s)
    chat = payload.endpoint == CHAT_ENDPOINT
    try:
        parsed = (parse_chat_request if chat else parse_completion_request)(body)
    except InvalidRequest as e:
        e.param = f"body.{e.param}" if e.param else "body"
        raise
    require_generative(spec)
    model = await services.catalog.info(spec, wait_s=window_s)
    prepare: Callable[..., Prepared] = prepare_chat if chat else prepare_completion
    try:
        prepared = await asyncio.to_thread(
            prepare,
            parsed,
            model.tokenizer,
            max_model_len=model.max_model_len,
            max_n=services.settings.max_n,
            serving=spec.serving,
        )
    except InvalidRequest as e:
        e.param = f"body.{e.param}" if e.param else "body"
        raise
    return _Queued(prepared.prompt_token_ids, prepared.sampling, prepared.tools)


async def _prepare_embeddings(
    services: Services, spec: DeploymentSpec, body: dict[str, Any], window_s: float
) -> _Queued:
    require_embedding(spec, str(body["model"]))  # first: a chat body to a chat model
    try:
        req = parse_embedding_request(body)
        model = await services.catalog.info(spec, wait_s=window_s)
        inputs = await asyncio.to_thread(tokenize_inputs, req, model.tokenizer, model.max_model_len)
    except InvalidRequest as e:
        e.param = f"body.{e.param}" if e.param else "body"
        raise
    prompt, sampling = job_work(req, inputs)
    return _Queued(prompt, sampling, encoding_format=req.encoding_format)


# What a parked job's record carries until its request can be tokenized.
_UNPREPARED = _Queued([], SamplingSpec(max_tokens=0))


def encode_parked(payload: JobCreate, caller: Caller) -> str:
    """A parked job's submission, as `decode_parked` reads it back."""
    parked = {"payload": payload.model_dump(mode="json"), "admin": caller.is_admin}
    return msgspec.json.encode(parked).decode()


def decode_parked(record: JobRecord) -> tuple[JobCreate, Caller]:
    """The submission and caller of a parked job."""
    parked = msgspec.json.decode(record.submission)
    caller = Caller(tenant=record.tenant, key_id=record.work.key_id, is_admin=parked["admin"])
    return JobCreate.model_validate(parked["payload"]), caller


def first_attempt(
    caller: Caller, spec: DeploymentSpec, prepared: _Queued, job_id: str, *, traceparent: str
) -> WorkItem:
    """The first attempt of job `job_id`."""
    return WorkItem(
        request_id=attempt_request_id(job_id, 1),
        deployment=spec.name,
        prompt_token_ids=prepared.prompt_token_ids,
        sampling=prepared.sampling,
        tenant=caller.tenant,
        enqueued_at_s=time.time(),
        job_id=job_id,
        key_id=caller.key_id,
        price_per_1m_input_tokens_micros=spec.price_per_1m_input_tokens_micros,
        price_per_1m_output_tokens_micros=spec.price_per_1m_output_tokens_micros,
        traceparent=traceparent,
        # Bound to this deployment, retries too: a runner of a later deployment of the
        # same name fails the attempt instead of running it (ServingLoop._admit).
        deployment_uid=spec.uid,
    )


def _new_record(
    caller: Caller,
    spec: DeploymentSpec,
    payload: JobCreate,
    prepared: _Queued,
    max_attempts: int,
    *,
    traceparent: str = "",
    job_id: str = "",
) -> JobRecord:
    job_id = job_id or new_job_id()
    work = first_attempt(caller, spec, prepared, job_id, traceparent=traceparent)
    webhook = payload.webhook
    return JobRecord(
        job_id=job_id,
        tenant=caller.tenant,
        deployment=public_name(spec.name),
        endpoint=payload.endpoint,
        work=work,
        request_id=work.request_id,
        max_attempts=max_attempts,
        webhook_url=webhook.url if webhook else "",
        webhook_events=sorted(set(webhook.events or job_events())) if webhook else [],
        metadata=payload.metadata or {},
        tools=prepared.tools,
        encoding_format=prepared.encoding_format,
    )


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
