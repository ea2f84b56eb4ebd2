"""Resuming a stream whose connection broke: GET /v1/chat/completions/{id}/stream and
GET /v1/completions/{id}/stream, with the `Last-Event-ID` the client last received
(and GET /v1/responses/{id}?stream=true&starting_after=N, routes_responses, OpenAI's way).

Any frontdoor answers it: the request's events are in Redis (its event stream, kept for
EBB_RESULT_TTL_S after it ended), and so is how its first frontdoor rendered them
(ebb.queue.stream_views). The events are replayed from the start through the same
`ResponseBuilder` and numbered by the same `EventIds` (their `id:` lines written for a
client that asks, as live: `X-Ebb-Resumable: 1` or a `Last-Event-ID`), the ones the
client has are dropped, and the rest follow live until the request ends. Only the
request's tenant may resume it (its view is kept under the tenant); any other caller, an
id never streamed or one whose events have expired gets 404. Nothing is billed or
rate-limited again: the request ran once. A resumed client that leaves does not cancel
the request (it may reconnect again); the request runs to its end.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from ebb.errors import EbbError, JobError, NotFound
from ebb.frontdoor.auth import calling
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.hot_routes import RequestOnlyRoute
from ebb.frontdoor.routes_openai import Answer, answer_of
from ebb.frontdoor.services import Services
from ebb.frontdoor.sse_ids import EventIds, ids_wanted, last_event_number
from ebb.openai.response_builder import EndpointKind, ResponseBuilder
from ebb.queue.requests import EventReader
from ebb.queue.schema import Claimed, Continued, Failed, Finished, Progress
from ebb.queue.stream_views import StreamView

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", route_class=RequestOnlyRoute)

# While the request runs, how long to wait for an event before checking its state.
_EVENT_SILENCE_S = 15.0
# After a Failed event, how long to look for the Claimed of a run that followed it.
_RERUN_PEEK_S = 0.05
_RUNNING_STATES = ("queued", "claimed")


@router.get("/chat/completions/{request_id}/stream")
async def resume_chat(request: Request) -> Response:
    return await _resume(request, EndpointKind.CHAT)


@router.get("/completions/{request_id}/stream")
async def resume_completion(request: Request) -> Response:
    return await _resume(request, EndpointKind.COMPLETION)


async def _resume(request: Request, kind: EndpointKind) -> Response:
    services, caller = await calling(request)
    request_id: str = request.path_params["request_id"]
    view = await found_view(services, caller, request_id, kind=kind, param="request_id")
    after = last_event_number(request_id, request.headers.get("last-event-id"))
    stamped = ids_wanted(request.headers)
    return replay(services, request_id, view, answer_of(kind), after, stamped=stamped)


async def found_view(
    services: Services,
    caller: Caller,
    request_id: str,
    *,
    kind: EndpointKind,
    param: str,
    responses: bool = False,
) -> StreamView:
    """The caller's view of a stream of `kind` (a Responses API one with `responses`)
    whose events are still kept; NotFound (naming `param`) otherwise."""
    view = await services.stream_views.get(caller.tenant, request_id)
    if (
        view is None
        or view.kind != kind.value
        or (view.response is not None) != responses
        or not await services.stream_views.has_events(request_id)
    ):
        raise NotFound(
            f"No stream {request_id!r} to resume: it was not a streamed request of this "
            "endpoint, it is another key's tenant's, or its events have expired (they are "
            "kept EBB_RESULT_TTL_S after it ended). Send the request again.",
            param=param,
        )
    return view


def replay(
    services: Services,
    request_id: str,
    view: StreamView,
    answer: Answer,
    after: int,
    *,
    stamped: bool,
) -> StreamingResponse:
    """The stream's events after event `after`, rendered by `answer` as they were live
    (with their ids when `stamped`: the client asked, sse_ids)."""
    log.info("frontdoor: %s resumed after event %d", request_id, after)
    ids = EventIds(request_id, after, stamped=stamped)
    return StreamingResponse(
        _replayed(services, request_id, view, answer, ids),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Request-Id": request_id},
    )


def builder_of(view: StreamView, request_id: str) -> ResponseBuilder:
    """The builder the request's first frontdoor rendered its stream with."""
    return ResponseBuilder(
        EndpointKind(view.kind),
        request_id=request_id,
        model=view.model,
        created_s=view.created_s,
        n=view.n,
        include_usage=view.include_usage,
        continuous_usage_prompt_tokens=view.continuous_usage_prompt_tokens,
        logprobs=view.logprobs,
        tools=view.tools,
    )


async def _replayed(
    services: Services, request_id: str, view: StreamView, answer: Answer, ids: EventIds
) -> AsyncIterator[bytes]:
    """The answer's SSE events as the live stream wrote them, those after `ids`' start."""
    chunks = _chunks(services, request_id, builder_of(view, request_id))
    error: EbbError | None = None
    try:
        async with contextlib.aclosing(answer.stream(chunks)) as lines:
            async for line in lines:
                if stamped := ids.stamp(line):
                    yield stamped
    except EbbError as e:
        error = e
    if error is not None and (stamped := ids.stamp(answer.stream_error(error))):
        yield stamped
    if stamped := ids.stamp(answer.stream_end()):
        yield stamped


async def _chunks(
    services: Services, request_id: str, builder: ResponseBuilder
) -> AsyncIterator[dict[str, Any]]:
    """The chunk objects of the request's events, from its first (as routes_openai's
    `_stream_chunks` renders them live). Raises JobError when the request failed."""
    async for event in _recorded(services, services.queue.events(request_id), request_id):
        if isinstance(event, Progress):
            for chunk in builder.chunks_for(event):
                yield chunk
        elif isinstance(event, Finished):
            for chunk in builder.final_chunks(event):
                yield chunk
        else:
            raise JobError(f"The request failed while running: {event.message}", code=event.code)


async def _recorded(
    services: Services, reader: EventReader, request_id: str
) -> AsyncIterator[Progress | Finished | Failed]:
    """The request's events until its end, across the runs it took: a Failed event
    followed by another run (its runner was lost and the request ran again) is not its
    end, as it was not for the client that streamed it live; nor is a continuation's
    Continued event (its output goes on from the next token, see ebb.queue.continuation)."""
    while True:
        event = await reader.next(_EVENT_SILENCE_S)
        if event is None:
            if await _still_running(services, request_id):
                continue
            event = Failed(message="the request ended without a result", code="lost")
        if isinstance(event, Claimed | Continued):
            continue
        if isinstance(event, Failed):
            after = await reader.next(_RERUN_PEEK_S)
            if isinstance(after, Claimed) or (
                after is None and await _still_running(services, request_id)
            ):
                continue
        yield event
        if isinstance(event, Finished | Failed):
            return


async def _still_running(services: Services, request_id: str) -> bool:
    state = await services.queue.request_state(request_id)
    return state.get("state") in _RUNNING_STATES
