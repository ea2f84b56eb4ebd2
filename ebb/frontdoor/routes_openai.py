"""OpenAI-compatible inference endpoints: /v1/models, /v1/chat/completions, /v1/completions.

`serve` is the one path every generative request takes (parse, route, admit, run, bill),
whichever API it came through: an `Answer` says how its endpoint reads the request into a
chat or completions request and writes the chat/completions result (or stream of chunks)
as that endpoint's answer. Chat and completions pass their results through as they are;
the Responses API (routes_responses) reshapes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ebb.errors import EbbError, InvalidRequest, JobError, RequestTimeout
from ebb.frontdoor import tenancy
from ebb.frontdoor.adapter_prices import as_served
from ebb.frontdoor.adapters import served_by_base
from ebb.frontdoor.auth import CallerDep, calling
from ebb.frontdoor.body import decoded_json
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.errors_http import error_response
from ebb.frontdoor.execution import ClientGone, Running, unless_disconnected
from ebb.frontdoor.hot_routes import RequestOnlyRoute
from ebb.frontdoor.model_cards import model_card
from ebb.frontdoor.observe import RequestObservation
from ebb.frontdoor.ratelimit import Reservation
from ebb.frontdoor.redis_down import unavailable
from ebb.frontdoor.services import Services, ServicesDep
from ebb.frontdoor.sse_ids import EventIds, ids_wanted
from ebb.frontdoor.tenant_writes import require_tenant_write_room
from ebb.frontdoor.version_routing import routed, version_headers, version_of
from ebb.openai.response_builder import (
    SSE_DONE,
    EndpointKind,
    ResponseBuilder,
    new_request_id,
    sse_line,
)
from ebb.openai.schema import (
    ChatCompletionRequest,
    CompletionRequest,
    parse_chat_request,
    parse_completion_request,
)
from ebb.openai.template_budget import RenderNeedsThread, inline_renders
from ebb.openai.translate import (
    Prepared,
    prepare_chat,
    prepare_completion,
    require_generative,
)
from ebb.queue.connection import UNAVAILABLE_ERRORS
from ebb.queue.schema import Failed, Finished, Progress, WorkItem

log = logging.getLogger(__name__)
T = TypeVar("T")
router = APIRouter(prefix="/v1")
# The inference endpoints, handed the request without FastAPI's dependency solver.
inference = APIRouter(prefix="/v1", route_class=RequestOnlyRoute)


@router.get("/models")
async def list_models(caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    specs = await tenancy.visible_deployments(services.state, caller)
    by_name = {s.name: s for s in await services.state.list_deployments()}
    cards = [await model_card(services.catalog, s, by_name.get(s.base)) for s in specs]
    return {"object": "list", "data": cards}


@router.get("/models/{model_id}")
async def retrieve_model(model_id: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    spec = await tenancy.visible_deployment(services.state, caller, model_id)
    base = await services.state.get_deployment(spec.base) if spec.base else None
    return await model_card(services.catalog, spec, base)


class Answer(Protocol):
    """One endpoint's side of `serve`: its request in, its answer out.

    `serve` calls `new_request_id` first, then `parse` (the body as a chat or completions
    request; InvalidRequest for a bad one) and `prepare` (ebb.openai.translate's, for that
    request);
    after the run, `whole` with the chat/completions result, or `stream` with its chunk
    objects (it returns the SSE body), `stream_error` if the stream cannot go on, and
    `stream_end` last."""

    @property
    def label(self) -> str:
        """The endpoint as metrics and the access log name it."""
        ...

    def new_request_id(self) -> str: ...

    async def parse(self, body: object) -> ChatCompletionRequest | CompletionRequest: ...

    def prepare(self, parsed: Any, *args: Any, **kwargs: Any) -> Prepared: ...

    async def whole(self, result: dict[str, Any]) -> dict[str, Any]: ...

    def stream(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncGenerator[bytes, None]: ...

    def stream_error(self, error: EbbError) -> bytes: ...

    def stream_end(self) -> bytes: ...

    def resumable_as(self) -> dict[str, Any] | None:
        """What a stream's replay needs of the answer beyond its chunks (None: nothing)."""
        ...


@dataclass(frozen=True)
class PassThrough:
    """Chat completions and completions: the result and chunks are the answer as they are."""

    kind: EndpointKind
    parse_body: Callable[[object], ChatCompletionRequest | CompletionRequest]
    prepare: Callable[..., Prepared]

    @property
    def label(self) -> str:
        return self.kind.value

    def new_request_id(self) -> str:
        return new_request_id(self.kind)

    async def parse(self, body: object) -> ChatCompletionRequest | CompletionRequest:
        return self.parse_body(body)

    async def whole(self, result: dict[str, Any]) -> dict[str, Any]:
        return result

    async def stream(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncGenerator[bytes, None]:
        async for chunk in chunks:
            yield sse_line(chunk)

    def stream_error(self, error: EbbError) -> bytes:
        return sse_line(error.to_body())

    def stream_end(self) -> bytes:
        return SSE_DONE

    def resumable_as(self) -> dict[str, Any] | None:
        return None


_CHAT = PassThrough(EndpointKind.CHAT, parse_chat_request, prepare_chat)
_COMPLETION = PassThrough(EndpointKind.COMPLETION, parse_completion_request, prepare_completion)


def answer_of(kind: EndpointKind) -> PassThrough:
    """The chat or completions endpoint's answer (what a resumed stream is rendered by)."""
    return _CHAT if kind is EndpointKind.CHAT else _COMPLETION


@inference.post("/chat/completions")
async def chat_completions(request: Request) -> Response:
    services, caller = await calling(request)
    return await serve(request, services, caller, _CHAT)


@inference.post("/completions")
async def completions(request: Request) -> Response:
    services, caller = await calling(request)
    return await serve(request, services, caller, _COMPLETION)


async def serve(request: Request, services: Services, caller: Caller, answer: Answer) -> Response:
    """Serve one request, observed from arrival to its end (a stream ends in `_stream`)."""
    request_id = answer.new_request_id()
    observed = RequestObservation(
        services.metrics, request_id, caller, answer.label, request.headers
    )
    try:
        response = await _serve_observed(request, services, caller, answer, observed)
    except EbbError as e:
        e.request_id = request_id
        e.version = observed.version
        observed.end_with_error(e)
        # Answered here rather than raised to the app's handler (the same response): a
        # refusal is the answer a burst gets, and each layer an exception unwinds costs.
        return error_response(e)
    except Exception:
        observed.end(500, "internal_error")
        raise
    if not isinstance(response, StreamingResponse):
        observed.end(response.status_code)
    return response


async def _serve_observed(
    request: Request,
    services: Services,
    caller: Caller,
    answer: Answer,
    observed: RequestObservation,
) -> Response:
    request_id = observed.request_id
    ids = EventIds(request_id, stamped=ids_wanted(request.headers))
    body = _json_body(request)
    parsed = await answer.parse(body)
    route = await routed(services.state, caller, parsed.model, request.headers)
    # The deployment named: its prices and version, even when its base serves it.
    priced = route.spec
    observed.deployment = parsed.model
    observed.version = version_of(priced)
    route, adapter = await served_by_base(services.state, caller, route, request.headers)
    spec = route.spec
    priced = as_served(priced, spec)  # an adapter's: never below its base's (adapter_prices)
    require_generative(spec)
    # A full queue refuses at once, and a saturated one a sheddable caller: no tokenizing,
    # no enqueue attempt (enqueue.lua checks again, atomically, for requests let through).
    await services.executor.refuse_if_full(
        spec, route.depth, key_id=caller.key_id, tenant=caller.tenant
    )
    window_s = spec.admission_timeout_s or services.settings.admission_timeout_s
    model = await services.catalog.info(spec, wait_s=window_s)
    prepared: Prepared = await _off_loop_if_long(
        _body_bytes(request),
        answer.prepare,
        parsed,
        model.tokenizer,
        max_model_len=model.max_model_len,
        max_n=services.settings.max_n,
        serving=spec.serving,
    )
    work = WorkItem(
        request_id=request_id,
        deployment=spec.name,
        prompt_token_ids=prepared.prompt_token_ids,
        sampling=prepared.sampling,
        tenant=caller.tenant,
        enqueued_at_s=time.time(),
        key_id=caller.key_id,
        price_per_1m_input_tokens_micros=priced.price_per_1m_input_tokens_micros,
        price_per_1m_output_tokens_micros=priced.price_per_1m_output_tokens_micros,
        traceparent=observed.traceparent(),
        adapter=adapter,
    )
    created_s = int(time.time())
    builder = prepared.builder(request_id, created_s)
    executor = services.executor
    reservation = await services.limiter.reserve(caller, work)
    streaming = False

    async def admit() -> Running:
        running = await executor.admit(work, spec, route.status)
        reservation.ran = True
        observed.admitted(running.queued_s, work.enqueued_at_s)
        return running

    async def answer_whole() -> dict[str, Any]:
        new_builder = lambda: prepared.builder(request_id, int(time.time()))  # noqa: E731
        return await _collect(services, await admit(), new_builder, reservation, observed)

    try:
        if prepared.stream:
            # Resumable (any frontdoor replays it from Redis), kept only once its limits
            # and budget are reserved: a refused request writes nothing.
            await require_tenant_write_room(services, "streamed requests")
            view = prepared.stream_view(caller.tenant, created_s, answer.resumable_as())
            await services.stream_views.put(request_id, view)
            running = await unless_disconnected(request, work, executor, admit())
            streaming = True
            return StreamingResponse(
                _stream(services, running, builder, reservation, observed, answer, ids),
                media_type="text/event-stream",
                headers={
                    "Cache-Control": "no-cache",
                    "X-Request-Id": request_id,
                    **version_headers(priced),
                },
            )
        # Admitted and answered under one watch for the client leaving (one pair of
        # tasks per request, not one per stage).
        result = await unless_disconnected(request, work, executor, answer_whole())
        return JSONResponse(
            await answer.whole(result),
            headers={"X-Request-Id": request_id, **version_headers(priced)},
        )
    except ClientGone:
        # Nobody is listening; 499 is what proxies log for a client that closed first.
        observed.billed(await services.executor.billed_counts(request_id))
        return Response(status_code=499)
    finally:
        if not streaming and reservation.settles_anything:  # a stream settles when it ends
            await asyncio.shield(reservation.settle())


async def _collect(
    services: Services,
    running: Running,
    new_builder: Callable[[], ResponseBuilder],
    reservation: Reservation,
    observed: RequestObservation,
) -> dict[str, Any]:
    """The whole answer; a request whose runner was lost runs again (nothing was sent)."""
    builder = new_builder()
    async for event in services.executor.events(running):
        reservation.observe(event)
        observed.on_event(event)
        if isinstance(event, Progress):
            builder.add(event)
        elif isinstance(event, Finished):
            return builder.response(event)
        elif isinstance(event, Failed):
            if await services.executor.rerun(running, event):
                return await _collect(services, running, new_builder, reservation, observed)
            raise await _failed(services, running, event, observed)
    raise JobError("the request ended without a result")


async def _stream(
    services: Services,
    running: Running,
    builder: ResponseBuilder,
    reservation: Reservation,
    observed: RequestObservation,
    answer: Answer,
    ids: EventIds,
) -> AsyncIterator[bytes]:
    """SSE body (with event ids if the client asked, sse_ids); if the client leaves
    mid-stream, the request is aborted in the engine.

    A stream that cannot go on (runner lost after output, Redis gone for longer than
    EBB_REDIS_OUTAGE_S) ends with the answer's error event and end, never silently."""
    finished = False
    try:
        error: EbbError | None = None
        chunks = _stream_chunks(services, running, builder, reservation, observed)
        try:
            async with contextlib.aclosing(answer.stream(chunks)) as lines:
                async for line in lines:
                    yield ids.stamp(line)
        except UNAVAILABLE_ERRORS as e:  # nothing to cancel through a Redis not there
            log.warning(
                "frontdoor: %s cut short, Redis unavailable: %s", running.work.request_id, e
            )
            error = unavailable(services.settings.redis_retry_after_s)
        except EbbError as e:  # the request failed, or a rerun found no runner in time
            error = e
        if error is not None:
            yield ids.stamp(answer.stream_error(error))
        finished = True
        if end := answer.stream_end():
            yield ids.stamp(end)
    finally:
        # A stream cut by a drain's end keeps its request: its client resumes elsewhere.
        if not finished and not services.drain.draining:
            # This runs while the response task is being cancelled, where an await need not
            # return: the abort, its billed counts and the settling go on in their own task.
            task = asyncio.get_running_loop().create_task(
                _client_left(services, running.work, observed, reservation)
            )
            _LEFT_TASKS.add(task)
            task.add_done_callback(_LEFT_TASKS.discard)
        else:
            observed.end(200 if finished else 499)
            if reservation.settles_anything:
                await asyncio.shield(reservation.settle())


# The tasks of streams whose clients left, held until they end (the loop holds only weakly).
_LEFT_TASKS: set[asyncio.Task[None]] = set()


async def _client_left(
    services: Services, work: WorkItem, observed: RequestObservation, reservation: Reservation
) -> None:
    """A stream whose client left: aborted in the engine, its access line written with
    the tokens its end recorded (what the ledger bills), its limits settled."""
    try:
        with contextlib.suppress(Exception):
            await services.executor.cancel(work)
            observed.billed(await services.executor.billed_counts(work.request_id))
    finally:
        observed.end(499)
        if reservation.settles_anything:
            await reservation.settle()


async def _stream_chunks(
    services: Services,
    running: Running,
    builder: ResponseBuilder,
    reservation: Reservation,
    observed: RequestObservation,
) -> AsyncIterator[dict[str, Any]]:
    """The chunk objects of a request's events; before any output, a lost runner means a
    rerun. Raises JobError when the request fails."""
    sent_output = False
    async for event in services.executor.events(running):
        reservation.observe(event)
        observed.on_event(event)
        if isinstance(event, Progress):
            sent_output = True
            for chunk in builder.chunks_for(event):
                yield chunk
        elif isinstance(event, Finished):
            for chunk in builder.final_chunks(event):
                yield chunk
        elif isinstance(event, Failed):
            if not sent_output and await services.executor.rerun(running, event):
                async for chunk in _stream_chunks(
                    services, running, builder, reservation, observed
                ):
                    yield chunk
                return
            raise await _failed(services, running, event, observed)


async def _failed(
    services: Services, running: Running, event: Failed, observed: RequestObservation
) -> EbbError:
    """`_failure`; a request stopped at its time limit is logged with what it was billed."""
    if event.code == "request_timeout":
        observed.billed(await services.executor.billed_counts(running.work.request_id))
    return _failure(event)


def _failure(event: Failed) -> EbbError:
    """What a request that failed on its runner answers: a 400 when its LoRA adapter could
    not be served (the deployment's input is at fault), else a failed job's error."""
    message = f"The request failed while running: {event.message}"
    if event.code == "invalid_adapter":
        return InvalidRequest(message, param="model", code=event.code)
    if event.code == "request_timeout":
        return RequestTimeout(event.message)
    return JobError(message, code=event.code)


# Bodies up to this size are rendered and tokenized on the event loop: a short prompt
# takes well under a millisecond, less than the hop to a worker thread and back costs
# (two context switches, the GIL handed over twice) on a busy machine.
_INLINE_PREPARE_MAX_BYTES = 8 * 1024


async def _off_loop_if_long(
    body_bytes: int, prepare: Callable[..., T], *args: Any, **kwargs: Any
) -> T:
    """`prepare(*args, **kwargs)`; in a worker thread when the body is long (rendering and
    tokenizing a long prompt is CPU work that must not stall the event loop), or when its
    chat template takes more than a short render's steps (a template is a tenant's code:
    `ebb.openai.template_budget`)."""
    if body_bytes <= _INLINE_PREPARE_MAX_BYTES:
        try:
            with inline_renders():
                return prepare(*args, **kwargs)
        except RenderNeedsThread:
            pass
    return await asyncio.to_thread(prepare, *args, **kwargs)


def _body_bytes(request: Request) -> int:
    try:
        return int(request.headers.get("content-length", ""))
    except ValueError:  # chunked: treat as long
        return _INLINE_PREPARE_MAX_BYTES + 1


def _json_body(request: Request) -> object:
    body = decoded_json(request)  # read, bounded and decoded by BodyGuard
    if body is None:
        raise InvalidRequest(
            "The request body is missing; send a JSON object.", code="missing_body"
        )
    return body
