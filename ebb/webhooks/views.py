"""What clients see of a job: the API's job object and the webhook event bodies.

A webhook event's `data` is the job object as of the event (without the delivery log), so
`GET /v1/jobs/{id}` after job.succeeded shows the same result, usage and timings.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec

from ebb.queue.job_schema import (
    DeliveryAttempt,
    DeliveryRecord,
    DeliveryState,
    JobEvent,
    JobRecord,
    JobStatus,
)


def current_status(record: JobRecord, attempt_state: str | None) -> JobStatus:
    """The job's status, reading through to its attempt where the collector has not looked
    yet: a claimed attempt means running. A job is shown settled only once the collector
    settled it, result and usage included."""
    if record.status.is_terminal:
        return record.status
    if attempt_state == "claimed" or record.status is JobStatus.RUNNING:
        return JobStatus.RUNNING
    if attempt_state in ("finished", "cancelled", "failed"):
        return JobStatus.RUNNING  # ended, being collected (or retried)
    return JobStatus.QUEUED


def _seconds(ms: int) -> float | None:
    return ms / 1000 if ms else None


def _span_s(start_ms: int, end_ms: int) -> float | None:
    return round((end_ms - start_ms) / 1000, 3) if start_ms and end_ms else None


def job_view(
    record: JobRecord,
    *,
    status: JobStatus | None = None,
    deliveries: list[tuple[DeliveryRecord, list[DeliveryAttempt]]] | None = None,
) -> dict[str, Any]:
    """The job object; `deliveries` (the attempt log) only in API answers."""
    view: dict[str, Any] = {
        "id": record.job_id,
        "object": "job",
        "model": record.deployment,
        "endpoint": record.endpoint,
        "status": (status or record.status).value,
        "created_at": _seconds(record.created_ms),
        "started_at": _seconds(record.started_ms),
        "finished_at": _seconds(record.finished_ms),
        "expires_at": _seconds(record.expires_ms),
        "attempts": record.attempt,
        "metadata": record.metadata,
        "result": record.result,
        "usage": record.usage,
        "error": msgspec.structs.asdict(record.error) if record.error else None,
        "webhook": (
            {"url": record.webhook_url, "events": [e.value for e in record.webhook_events]}
            if record.webhook_url
            else None
        ),
        "timings": {
            "queued_s": _span_s(record.created_ms, record.started_ms),
            "run_s": _span_s(record.started_ms, record.finished_ms),
            "total_s": _span_s(record.created_ms, record.finished_ms),
        },
        "cancel_requested": record.cancel_requested,
        # What a parked job waits for before it can be queued ("weights_preparing").
        "waiting_for": record.waiting_for or None,
    }
    if deliveries is not None:
        view["deliveries"] = [delivery_view(d, attempts) for d, attempts in deliveries]
    return view


def delivery_view(record: DeliveryRecord, attempts: list[DeliveryAttempt]) -> dict[str, Any]:
    return {
        "webhook_id": record.webhook_id,
        "event": record.event.value,
        "url": record.url,
        "status": record.state.value,
        "created_at": _seconds(record.created_ms),
        "delivered_at": _seconds(record.delivered_ms),
        "next_attempt_at": (
            _seconds(record.next_ms) if record.state is DeliveryState.PENDING else None
        ),
        "attempts": [
            {
                "at": a.at_ms / 1000,
                "status_code": a.status_code,
                "latency_ms": round(a.latency_ms, 1),
                "error": a.error,
            }
            for a in attempts
        ],
    }


def event_body(event: JobEvent, record: JobRecord) -> str:
    """The body of `event`'s delivery: fixed once, sent unchanged on every attempt."""
    if event is JobEvent.STARTED:
        # As of the start, even when the job has ended by the time this is announced.
        record = msgspec.structs.replace(
            record,
            status=JobStatus.RUNNING,
            finished_ms=0,
            result=None,
            usage=None,
            error=None,
        )
        at_ms = record.started_ms
    else:
        at_ms = record.finished_ms
    timestamp = dt.datetime.fromtimestamp(at_ms / 1000, tz=dt.UTC)
    body = {
        "type": event.value,
        "timestamp": timestamp.isoformat().replace("+00:00", "Z"),
        "data": job_view(record),
    }
    return msgspec.json.encode(body).decode()
