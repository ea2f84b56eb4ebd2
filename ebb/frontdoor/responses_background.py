"""Background responses (`background: true`): a Responses request run as an async job.

The translated chat request is submitted through POST /v1/jobs' own path (the same checks,
rate limits, retries and billing as any job); the stored response records the job id and
shows `queued` until a read (`refreshed`) finds the job further along: `in_progress`
while it runs, then `completed` (or `incomplete`) with the job's result as its output,
`failed` or `cancelled`. A settled status is written back, so later reads and
previous_response_id find it without the job.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from fastapi import Request

from ebb.errors import Conflict, InvalidRequest, NotFound
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.job_requests import JobCreate
from ebb.frontdoor.response_caps import hold_room
from ebb.frontdoor.routes_jobs import submit_job
from ebb.frontdoor.routes_jobs_read import cancel_job
from ebb.frontdoor.services import Services
from ebb.openai.response_builder import CHAT_ENDPOINT
from ebb.openai.responses_objects import ResponseFrame, from_chat_completion, new_response_id
from ebb.openai.responses_schema import ResponsesRequest
from ebb.openai.responses_translate import echoed_fields, in_responses_terms
from ebb.queue.job_schema import JobStatus
from ebb.queue.response_store import ResponseStore, StoredResponse
from ebb.webhooks.views import current_status

UNSETTLED = ("queued", "in_progress")


async def submit(
    request: Request,
    services: Services,
    caller: Caller,
    store: ResponseStore,
    req: ResponsesRequest,
    chain: list[str],
    items: list[dict[str, Any]],
    chat: dict[str, Any],
) -> dict[str, Any]:
    """Queue the response's job and store it as queued (room under the tenant's caps
    taken first); the Response object."""
    body = {name: value for name, value in chat.items() if name != "model"}
    payload = JobCreate(
        model=req.model, endpoint=CHAT_ENDPOINT, body=body, metadata=req.metadata or {}
    )
    frame = ResponseFrame(new_response_id(), req.model, int(time.time()), echoed_fields(req))
    record = StoredResponse(
        tenant=caller.tenant, response=frame.response("queued"), input_items=items, chain=chain
    )
    await hold_room(services, store, record)
    try:
        submitted = await submit_job(payload, request, caller, services, idempotency_key=None)
    except Exception as e:
        await store.delete(caller.tenant, frame.id)  # gives the room back
        if isinstance(e, InvalidRequest):
            if e.param and e.param.startswith("body."):
                e.param = e.param.removeprefix("body.")
            raise in_responses_terms(e) from None
        raise
    record.job_id = json.loads(bytes(submitted.body))["id"]
    await store.put(record)
    return record.response


async def refreshed(
    services: Services, store: ResponseStore, record: StoredResponse
) -> StoredResponse:
    """The record as of its job now (unchanged unless it is an unsettled background one)."""
    if not record.job_id or record.response["status"] not in UNSETTLED:
        return record
    job = await services.jobs.get(record.job_id)
    frame = ResponseFrame.of(record.response)
    if job is None:  # the job's record expired before anyone looked
        error = {"code": "expired", "message": "The response's job expired unread."}
        response = frame.response("failed", error=error)
    else:
        state = None
        if not job.status.is_terminal:
            state = (await services.jobs.attempt_state(job.request_id)).get("state")
        status = current_status(job, state)
        if status is JobStatus.QUEUED:
            return record
        if status is JobStatus.RUNNING:
            response = frame.response("in_progress")
        elif status is JobStatus.SUCCEEDED and job.result is not None:
            response = from_chat_completion(frame, job.result)
        elif status is JobStatus.CANCELLED:
            response = frame.response("cancelled")
        else:
            info = job.error
            error = {
                "code": info.code if info else "server_error",
                "message": info.message if info else "The response failed.",
            }
            response = frame.response("failed", error=error)
    if response["status"] == record.response["status"]:
        return record
    record.response = response
    await store.put(record, keep_ttl=True)
    return record


async def cancel(
    services: Services, caller: Caller, store: ResponseStore, record: StoredResponse
) -> StoredResponse:
    """Cancel a background response's job (nothing to do once it settled); the record
    after. Refuses a response that was not created in the background."""
    if not record.job_id:
        raise InvalidRequest(
            "Only a background response (background: true) can be cancelled; this one "
            "ran while its request waited.",
            param="response_id",
        )
    if record.response["status"] in UNSETTLED:
        # Settled (or expired) meanwhile: the refresh below shows how it ended.
        with contextlib.suppress(Conflict, NotFound):
            await cancel_job(record.job_id, caller, services)
    return await refreshed(services, store, record)
