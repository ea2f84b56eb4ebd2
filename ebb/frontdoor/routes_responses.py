"""OpenAI's Responses API: POST /v1/responses, and GET / DELETE / cancel / input_items of a
stored response.

A response is served as the chat completion `ebb.openai.responses_translate` writes for
it, through `routes_openai.serve` (the same admission, queue, runners, rate limits and billing as
chat); `ResponsesAnswer` reads the Responses request in and writes the chat result or
chunks out as a Response object or Responses events. `store` (the default) keeps it, per
tenant, for EBB_RESPONSES_RETENTION_S: a tenant reads, continues (previous_response_id)
and deletes only its own; any other id is 404. Each record holds its own turn; a
continuation reads the chain's earlier records (`_conversation`). A stored response takes
room under its tenant's caps before it runs (`response_caps`), given back when it is
refused, deleted or expires. `background: true` runs it as a job (`responses_background`).
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from ebb.errors import EbbError, InvalidRequest, NotFound
from ebb.frontdoor import responses_background as background
from ebb.frontdoor import routes_resume as resume
from ebb.frontdoor.auth import CallerDep, calling
from ebb.frontdoor.body import decoded_json
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.hot_routes import RequestOnlyRoute
from ebb.frontdoor.list_page import list_page
from ebb.frontdoor.response_caps import hold_room
from ebb.frontdoor.routes_openai import serve
from ebb.frontdoor.services import Services, ServicesDep
from ebb.frontdoor.sse_ids import event_number, ids_wanted, last_event_number
from ebb.openai.response_builder import EndpointKind
from ebb.openai.responses_objects import (
    ResponseFrame,
    from_chat_completion,
    new_response_id,
    response_of_item,
)
from ebb.openai.responses_schema import (
    RESPONSE_ID_PATTERN,
    ResponsesRequest,
    parse_responses_request,
)
from ebb.openai.responses_stream import ResponseEvents, sse
from ebb.openai.responses_translate import (
    chat_body,
    echoed_fields,
    in_responses_terms,
    input_items,
)
from ebb.openai.schema import ChatCompletionRequest, parse_chat_request
from ebb.openai.translate import Prepared, prepare_chat
from ebb.queue.response_store import ResponseStore, StoredResponse

router = APIRouter(prefix="/v1/responses")
# POST /v1/responses, handed the request without FastAPI's dependency solver (as chat).
inference = APIRouter(prefix="/v1", route_class=RequestOnlyRoute)

# (the chain's response ids, the conversation before this turn, its input items, the chat
# body serving it)
Turn = tuple[list[str], list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]


def response_store(services: Services) -> ResponseStore:
    settings = services.settings
    return ResponseStore(
        services.redis,
        retention_s=settings.responses_retention_s,
        max_count=settings.responses_max_per_tenant,
        max_bytes=settings.responses_max_tenant_bytes,
    )


@inference.post("/responses")
async def create_response(request: Request) -> Response:
    services, caller = await calling(request)
    body = decoded_json(request)
    if isinstance(body, dict) and body.get("background") is True:
        store = response_store(services)
        req = parse_responses_request(body)
        chain, _, items, chat = await _turn(services, store, caller, req)
        _check_chat(chat)
        created = await background.submit(request, services, caller, store, req, chain, items, chat)
        return JSONResponse(created, headers={"X-Request-Id": created["id"]})
    answer = ResponsesAnswer(services, caller)
    response = await serve(request, services, caller, answer)
    if response.status_code >= 400:  # refused or failed: nothing will be stored
        await answer.release_room()
    return response


@router.get("/{response_id}", response_model=None)
async def retrieve_response(
    request: Request,
    response_id: str,
    caller: CallerDep,
    services: ServicesDep,
    stream: bool = False,
    # Text, read once the caller is known to own the response (sse_ids.event_number).
    starting_after: str | None = None,
) -> dict[str, Any] | Response:
    """The stored response; with `stream=true`, the events of a streamed response after
    `starting_after` (its sequence number; or the `Last-Event-ID` header), then the rest
    as they come (routes_resume)."""
    if stream:
        view = await resume.found_view(
            services,
            caller,
            response_id,
            kind=EndpointKind.CHAT,
            param="response_id",
            responses=True,
        )
        after = event_number(starting_after, param="starting_after")
        if after is None:
            after = last_event_number(response_id, request.headers.get("last-event-id"))
        assert view.response is not None  # found_view's `responses`
        answer = ResponsesAnswer.replaying(services, caller, view.response)
        stamped = ids_wanted(request.headers)
        return resume.replay(services, response_id, view, answer, after, stamped=stamped)
    store = response_store(services)
    record = await background.refreshed(services, store, await _found(store, caller, response_id))
    return record.response


@router.delete("/{response_id}")
async def delete_response(
    response_id: str, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    """Forget a stored response (a background one still running is cancelled first)."""
    store = response_store(services)
    record = await _found(store, caller, response_id)
    if record.job_id and record.response["status"] in background.UNSETTLED:
        await background.cancel(services, caller, store, record)
    await store.delete(caller.tenant, response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.post("/{response_id}/cancel")
async def cancel_response(
    response_id: str, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    store = response_store(services)
    record = await _found(store, caller, response_id)
    return (await background.cancel(services, caller, store, record)).response


@router.get("/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    caller: CallerDep,
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> dict[str, Any]:
    """The items the response was given (not the earlier turns'), as OpenAI pages them:
    newest first unless `order` is "asc"; `after` is the last id of the previous page."""
    record = await _found(response_store(services), caller, response_id)
    items = list(record.input_items)
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item.get("id") for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    return list_page(items, limit)


class ResponsesAnswer:
    """The Responses API's side of `serve`: one request, so it keeps the request's state
    (its Response frame, what to store, the stream's event state machine)."""

    label = "responses"

    def __init__(self, services: Services, caller: Caller):
        self._services = services
        self._store = response_store(services)
        self._caller = caller
        self._id = ""
        self._frame: ResponseFrame | None = None
        self._record: StoredResponse | None = None  # None: not stored
        self._events: ResponseEvents | None = None
        self._holds_room = False  # room held under the tenant's caps, not stored yet

    def new_request_id(self) -> str:
        self._id = new_response_id()
        return self._id

    async def parse(self, body: object) -> ChatCompletionRequest:
        req = parse_responses_request(body)
        chain, _, items, chat = await _turn(self._services, self._store, self._caller, req)
        self._frame = ResponseFrame(self._id, req.model, int(time.time()), echoed_fields(req))
        parsed = _check_chat(chat)
        if req.stored:
            record = StoredResponse(
                tenant=self._caller.tenant,
                response=self._frame.response("in_progress"),
                input_items=items,
                chain=chain,
            )
            await hold_room(self._services, self._store, record)
            self._holds_room = True
            self._record = record
        return parsed

    async def release_room(self) -> None:
        """Give back the room held for a response that will not be stored."""
        if self._holds_room:
            self._holds_room = False
            await self._store.delete(self._caller.tenant, self._id)

    def prepare(self, parsed: ChatCompletionRequest, *args: Any, **kwargs: Any) -> Prepared:
        try:
            return prepare_chat(parsed, *args, **kwargs)
        except InvalidRequest as e:
            raise in_responses_terms(e) from None

    async def whole(self, result: dict[str, Any]) -> dict[str, Any]:
        response = from_chat_completion(self._framed(), result)
        await self._keep(response)
        return response

    async def stream(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncGenerator[bytes, None]:
        events = self._events = ResponseEvents(self._framed())
        for event in events.start():
            yield sse(event)
        async for chunk in chunks:
            for event in events.feed(chunk):
                yield sse(event)
        final = events.finish()
        # Stored before the client hears it ended: its next turn may name it at once.
        if events.response is not None:
            await self._keep(events.response)
        for event in final:
            yield sse(event)

    def stream_error(self, error: EbbError) -> bytes:
        events = self._events or ResponseEvents(self._framed())
        return b"".join(sse(event) for event in events.fail(error.to_body()))

    def stream_end(self) -> bytes:
        return b""  # the Responses stream ends with its final event, no [DONE]

    def resumable_as(self) -> dict[str, Any]:
        return self._framed().response("in_progress")

    @classmethod
    def replaying(
        cls, services: Services, caller: Caller, response: dict[str, Any]
    ) -> ResponsesAnswer:
        """The answer that renders a resumed stream's events again: the same frame as
        `response` (resumable_as's), and nothing stored (its first frontdoor stored it)."""
        answer = cls(services, caller)
        answer._id = response["id"]
        answer._frame = ResponseFrame.of(response)
        return answer

    def _framed(self) -> ResponseFrame:
        assert self._frame is not None, "parse runs first"
        return self._frame

    async def _keep(self, response: dict[str, Any]) -> None:
        if self._record is not None:
            self._record.response = response
            await self._store.put(self._record)
            self._holds_room = False


async def _turn(
    services: Services, store: ResponseStore, caller: Caller, req: ResponsesRequest
) -> Turn:
    """(the chain's ids, the conversation before this turn, its input items, the chat
    body serving it)."""
    chain: list[str] = []
    context: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        found = await _found(store, caller, req.previous_response_id, "previous_response_id")
        previous = await background.refreshed(services, store, found)
        if previous.response.get("status") in background.UNSETTLED:
            raise InvalidRequest(
                f"The response {req.previous_response_id!r} has not finished; continue from "
                "it once GET /v1/responses/{id} shows it completed.",
                param="previous_response_id",
            )
        chain = [*previous.chain, req.previous_response_id]
        longest = services.settings.responses_max_chain
        if len(chain) >= longest:
            raise InvalidRequest(
                f"The conversation of {req.previous_response_id!r} already holds {len(chain)} "
                f"responses, the most a previous_response_id chain may (EBB_RESPONSES_MAX_CHAIN "
                f"is {longest}); start a new conversation, sending the turns you need as input.",
                param="previous_response_id",
            )
        context = await _conversation(store, caller, previous)
    items = await _resolved(store, caller, input_items(req))
    return chain, context, items, chat_body(req, context, items)


async def _conversation(
    store: ResponseStore, caller: Caller, previous: StoredResponse
) -> list[dict[str, Any]]:
    """Every item of `previous`'s chain, oldest first: the earlier responses' turns (one
    read), then its own; a 400 naming the first one gone (expired or deleted)."""
    earlier = await store.get_many(caller.tenant, previous.chain)
    for response_id, record in zip(previous.chain, earlier, strict=True):
        if record is None:
            raise InvalidRequest(
                f"The conversation before {previous.response['id']!r} is no longer stored: "
                f"its earlier response {response_id!r} expired or was deleted. Start a new "
                "conversation, sending the earlier turns you need as input items.",
                param="previous_response_id",
            )
    return [item for record in [*earlier, previous] if record for item in record.conversation()]


async def _resolved(
    store: ResponseStore, caller: Caller, items: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`items` with each item_reference replaced by the stored output item it names (a
    404 naming the reference when the caller has no such item)."""
    resolved = []
    for index, item in enumerate(items):
        if item["type"] != "item_reference":
            resolved.append(item)
            continue
        response_id = response_of_item(item["id"])
        record = await store.get(caller.tenant, response_id) if response_id else None
        output = record.response.get("output", []) if record else []
        found = next((o for o in output if o.get("id") == item["id"]), None)
        if found is None:
            raise NotFound(
                f"No item {item['id']!r} in your stored responses: item_reference names an "
                "output item of a stored response; send the item itself instead.",
                param=f"input.{index}.id",
            )
        resolved.append(found)
    return resolved


def _check_chat(chat: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return parse_chat_request(chat)
    except InvalidRequest as e:
        raise in_responses_terms(e) from None


async def _found(
    store: ResponseStore, caller: Caller, response_id: str, param: str = "response_id"
) -> StoredResponse:
    record = None
    if re.fullmatch(RESPONSE_ID_PATTERN, response_id):
        record = await store.get(caller.tenant, response_id)
    if record is None:
        raise NotFound(
            f"No response {response_id!r}: it was not stored (store: false), has expired, "
            "was deleted, or is another key's tenant's.",
            param=param,
        )
    return record
