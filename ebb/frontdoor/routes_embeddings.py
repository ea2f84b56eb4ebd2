"""`POST /v1/embeddings`, served by deployments whose engine runs as a pooling model
(`serving.task = "embed"`).

A request becomes one work item carrying all its inputs (concatenated, cut by
`SamplingSpec.embed_input_lengths`; the runner embeds each as an engine request of its
own, all in one batch), admitted, rate-limited and billed (prompt tokens at the
deployment's input price) exactly like a chat request, so that scale-from-zero, the
admission window and usage need nothing of their own. Jobs and Batch API lines carry the
same work item. One item rather than one per input keeps a request's queue, claim and
event traffic constant in its inputs. The vectors come back as the engine pooled them
(normalized), as float lists or, with `encoding_format: "base64"` (what the official SDK
asks for by default), as little-endian float32 bytes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Literal, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ebb.errors import InvalidRequest, JobError
from ebb.frontdoor.auth import calling
from ebb.frontdoor.body import decoded_json
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.hot_routes import RequestOnlyRoute
from ebb.frontdoor.services import Services
from ebb.frontdoor.version_routing import Routed, routed, version_headers
from ebb.openai.response_builder import embedding_response, embedding_vectors
from ebb.openai.schema import _to_invalid
from ebb.openai.tokenizer import PromptTokenizer
from ebb.queue.schema import DeploymentSpec, Failed, Finished, Progress, SamplingSpec, WorkItem

router = APIRouter(prefix="/v1", route_class=RequestOnlyRoute)

MAX_EMBEDDING_INPUTS = 256


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    model: str = Field(min_length=1)
    # A string, strings, a token array, or token arrays: always a list of one kind here.
    input: list[str] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _as_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and value and all(_is_token(v) for v in value):
            return [value]  # one token array
        return value

    @field_validator("input")
    @classmethod
    def _bounded(cls, value: list[str] | list[list[int]]) -> list[str] | list[list[int]]:
        if not value:
            raise ValueError("input must not be empty")
        if len(value) > MAX_EMBEDDING_INPUTS:
            raise ValueError(f"input may hold at most {MAX_EMBEDDING_INPUTS} items")
        return value


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_embedding_request(body: object) -> EmbeddingRequest:
    """Validate a decoded embeddings body; raises InvalidRequest with `param` set."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    try:
        return EmbeddingRequest.model_validate(body)
    except ValidationError as e:
        raise _to_invalid(e) from e


def tokenize_inputs(
    req: EmbeddingRequest, tokenizer: PromptTokenizer, max_model_len: int
) -> list[list[int]]:
    """Each input's token ids, checked against the vocabulary and the context."""
    inputs: list[list[int]] = []
    for i, item in enumerate(cast("list[str | list[int]]", req.input)):
        ids = tokenizer.encode(item) if isinstance(item, str) else list(item)
        if not ids or (isinstance(item, str) and not item):
            raise InvalidRequest(f"input {i} is empty; send some text.", param=f"input.{i}")
        if len(ids) > max_model_len:
            raise InvalidRequest(
                f"input {i} has {len(ids)} tokens; this model takes at most {max_model_len}. "
                "Shorten or split it.",
                param=f"input.{i}",
            )
        bad = [t for t in ids if not 0 <= t < tokenizer.vocab_size]
        if bad:
            raise InvalidRequest(
                f"input {i} holds token id {bad[0]}, outside this model's vocabulary "
                f"(0 to {tokenizer.vocab_size - 1}).",
                param=f"input.{i}",
            )
        inputs.append(ids)
    return inputs


def require_embedding(spec: DeploymentSpec, model: str) -> None:
    """`model` (the name asked for, which routes to `spec`) serves embeddings."""
    if spec.serving.task != "embed":
        raise InvalidRequest(
            f"The model {model!r} is a generative deployment; embeddings come from a "
            'deployment created with "serving": {"task": "embed"}.',
            param="model",
        )


def job_work(req: EmbeddingRequest, inputs: list[list[int]]) -> tuple[list[int], SamplingSpec]:
    """An embeddings job's one work item: its inputs' tokens concatenated, and sampling that
    says where each input ends (the runner embeds each on its own)."""
    prompt = [t for ids in inputs for t in ids]
    sampling = SamplingSpec(
        max_tokens=1,
        embed=True,
        dimensions=req.dimensions,
        embed_input_lengths=[len(ids) for ids in inputs] if len(inputs) > 1 else [],
    )
    return prompt, sampling


@router.post("/embeddings")
async def embeddings(request: Request) -> JSONResponse:
    services, caller = await calling(request)
    req = parse_embedding_request(decoded_json(request))  # decoded by BodyGuard
    route = await routed(services.state, caller, req.model, request.headers)
    spec = route.spec
    require_embedding(spec, req.model)
    # As for chat: a full queue (or a saturated one, a sheddable caller) refuses before the
    # tokenizer is waited for or run.
    await services.executor.refuse_if_full(
        spec, route.depth, key_id=caller.key_id, tenant=caller.tenant
    )
    window_s = spec.admission_timeout_s or services.settings.admission_timeout_s
    model = await services.catalog.info(spec, wait_s=window_s)
    inputs = await asyncio.to_thread(tokenize_inputs, req, model.tokenizer, model.max_model_len)
    vectors, prompt_tokens = await _embed(services, caller, route, req, inputs)
    body = embedding_response(
        vectors, model=req.model, prompt_tokens=prompt_tokens, encoding_format=req.encoding_format
    )
    return JSONResponse(body, headers=version_headers(spec))


async def _embed(
    services: Services,
    caller: Caller,
    route: Routed,
    req: EmbeddingRequest,
    inputs: list[list[int]],
) -> tuple[list[list[float]], int]:
    """The request's inputs through admission and a runner: their vectors, prompt tokens."""
    spec = route.spec
    prompt, sampling = job_work(req, inputs)
    work = WorkItem(
        request_id=f"embd-{uuid.uuid4().hex}",
        deployment=spec.name,
        prompt_token_ids=prompt,
        sampling=sampling,
        tenant=caller.tenant,
        enqueued_at_s=time.time(),
        key_id=caller.key_id,
        price_per_1m_input_tokens_micros=spec.price_per_1m_input_tokens_micros,
    )
    executor = services.executor
    reservation = await services.limiter.reserve(caller, work)
    try:
        running = await executor.admit(work, spec, route.status)
        reservation.ran = True
        services.metrics.observe_admitted(spec.name, running.queued_s)
        progress: list[Progress] = []
        async for event in executor.events(running):
            reservation.observe(event)
            if isinstance(event, Progress):
                progress.append(event)
            elif isinstance(event, Finished):
                vectors = embedding_vectors(progress, len(inputs))
                if vectors is not None:
                    return vectors, event.prompt_tokens
                break
            elif isinstance(event, Failed):
                raise JobError(f"The embedding failed: {event.message}", code=event.code)
        raise JobError("the embedding ended without its vectors")
    finally:
        await asyncio.shield(reservation.settle())
