"""What a job is made of: its POST body (`JobCreate`), its request checked and tokenized as
the synchronous endpoint would (`prepare_job`), the record and first attempt it is queued
as, and a parked job's submission (`encode_parked`, `decode_parked`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from ebb.errors import InvalidRequest
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.routes_embeddings import (
    job_work,
    parse_embedding_request,
    require_embedding,
    tokenize_inputs,
)
from ebb.frontdoor.services import Services
from ebb.openai.response_builder import CHAT_ENDPOINT, EMBEDDINGS_ENDPOINT
from ebb.openai.schema import parse_chat_request, parse_completion_request
from ebb.openai.translate import Prepared, prepare_chat, prepare_completion, require_generative
from ebb.queue.job_schema import JobEvent, JobRecord, attempt_request_id
from ebb.queue.schema import DeploymentSpec, SamplingSpec, ToolCallFormat, WorkItem
from ebb.queue.versions import public_name

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


@dataclass(frozen=True)
class QueuedJob:
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
) -> QueuedJob:
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
    return QueuedJob(prepared.prompt_token_ids, prepared.sampling, prepared.tools)


async def _prepare_embeddings(
    services: Services, spec: DeploymentSpec, body: dict[str, Any], window_s: float
) -> QueuedJob:
    require_embedding(spec, str(body["model"]))  # first: a chat body to a chat model
    try:
        req = parse_embedding_request(body)
        model = await services.catalog.info(spec, wait_s=window_s)
        inputs = await asyncio.to_thread(tokenize_inputs, req, model.tokenizer, model.max_model_len)
    except InvalidRequest as e:
        e.param = f"body.{e.param}" if e.param else "body"
        raise
    prompt, sampling = job_work(req, inputs)
    return QueuedJob(prompt, sampling, encoding_format=req.encoding_format)


# What a parked job's record carries until its request can be tokenized.
UNPREPARED = QueuedJob([], SamplingSpec(max_tokens=0))


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
    caller: Caller, spec: DeploymentSpec, prepared: QueuedJob, job_id: str, *, traceparent: str
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


def new_job_record(
    caller: Caller,
    spec: DeploymentSpec,
    payload: JobCreate,
    prepared: QueuedJob,
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
