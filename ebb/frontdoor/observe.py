"""One inference request as the frontdoor saw it, reported once when it ends.

A `RequestObservation` starts when the request arrives (it sets the request id that every
log line about the request carries, and opens the request's span under the client's
trace context), follows its admission and output events, and on its end — answered,
refused, failed or abandoned — records the metrics (outcome, latency, TTFT, TPOT), writes
the request's one access-log line and ends its span.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, SpanKind

from ebb import logs, tracing
from ebb.errors import EbbError
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.metrics import Metrics
from ebb.queue.schema import Failed, Finished, Progress, RequestEvent

access_log = logging.getLogger("ebb.access")

# Failed-event codes that are the platform losing the request, not the request's fault.
_RUNNER_LOST_CODES = frozenset({"runner_lost", "lost"})


def outcome_of(status: int, code: str) -> tuple[str, str]:
    """(outcome, code) labels for a request that ended with `status` and error `code`."""
    if code in _RUNNER_LOST_CODES:
        return "runner_lost", code
    if status < 400:
        # A stream answers 200 before it can fail; its Failed event says how it ended.
        return ("error", code) if code else ("ok", str(status))
    if status == 499:
        return "cancelled", "499"
    if status == 429:  # a spend cap's refusal is told apart from a rate limit's
        return "rate_limited", "insufficient_quota" if code == "insufficient_quota" else "429"
    if status == 503:
        return "unavailable", code or "503"
    if status < 500:
        return "client_error", str(status)
    return "error", code or str(status)


class RequestObservation:
    def __init__(
        self,
        metrics: Metrics,
        request_id: str,
        caller: Caller,
        endpoint: str,
        headers: Mapping[str, str],
    ):
        self._metrics = metrics
        self.request_id = request_id
        self.tenant = caller.tenant
        self.endpoint = endpoint
        self.deployment = ""  # set once the model is known to exist
        self.version = 0  # the deployment's version admission picked (0: none yet)
        self._started = time.monotonic()
        self._queued_s: float | None = None
        self._first_token_at: float | None = None
        self._last_token_at: float | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._failure_code = ""
        self._ended = False
        logs.request_id.set(request_id)
        self._traced = tracing.active()
        self._started_ns = time.time_ns()
        # Untraced, no span at all: the API's no-op tracer still looks its provider up
        # (an environment read) on every span it starts.
        self._span = (
            tracing.tracer.start_span(
                "ebb.request",
                context=tracing.context_from(headers),
                kind=SpanKind.SERVER,
                start_time=self._started_ns,
                attributes={"ebb.request_id": request_id, "ebb.endpoint": endpoint},
            )
            if self._traced
            else INVALID_SPAN
        )

    def traceparent(self) -> str:
        """What the runner parents its spans on; "" when tracing is off."""
        return tracing.traceparent_of(self._span) if self._traced else ""

    def admitted(self, queued_s: float, enqueued_at_s: float) -> None:
        """Claimed after `queued_s` in the queue, which it entered at `enqueued_at_s`
        (the work item's time; the runner's queue-wait span starts there too)."""
        self._queued_s = queued_s
        self._metrics.observe_admitted(self.deployment, queued_s)
        if self._traced:
            parent = trace.set_span_in_context(self._span)
            end_ns = int(enqueued_at_s * 1e9)
            tracing.record_span("ebb.admission", parent, self._started_ns, end_ns)

    def on_event(self, event: RequestEvent) -> None:
        if isinstance(event, Progress):
            if any(c.token_count for c in event.choices):
                now = time.monotonic()
                self._first_token_at = self._first_token_at or now
                self._last_token_at = now
        elif isinstance(event, Finished):
            self.prompt_tokens = event.prompt_tokens
            self.completion_tokens = event.completion_tokens
        elif isinstance(event, Failed):
            self._failure_code = event.code

    def billed(self, counts: tuple[int, int] | None) -> None:
        """The (prompt, completion) tokens the request's end recorded, which the ledger
        bills (a cancelled request has no Finished event to count them from)."""
        if counts is not None:
            self.prompt_tokens, self.completion_tokens = counts

    def end_with_error(self, error: EbbError) -> None:
        self.end(error.status_code, error.code)

    def end(self, status: int, code: str = "") -> None:
        """Report the request (once; later calls are ignored)."""
        if self._ended:
            return
        self._ended = True
        now = time.monotonic()
        outcome, code = outcome_of(status, code or self._failure_code)
        ttft_s = tpot_s = None
        if self._first_token_at is not None:
            ttft_s = self._first_token_at - self._started
            if self.completion_tokens > 1 and self._last_token_at is not None:
                tpot_s = (self._last_token_at - self._first_token_at) / (self.completion_tokens - 1)
        duration_s = now - self._started
        self._metrics.observe_request(
            self.deployment, outcome, code, duration_s=duration_s, ttft_s=ttft_s, tpot_s=tpot_s
        )
        self._access_line(status, outcome, duration_s, ttft_s)
        if self._traced:
            self._span.set_attributes(
                {
                    "ebb.deployment": self.deployment,
                    "ebb.version": self.version,
                    "ebb.tenant": self.tenant,
                    "http.response.status_code": status,
                    "ebb.outcome": outcome,
                    "ebb.prompt_tokens": self.prompt_tokens,
                    "ebb.completion_tokens": self.completion_tokens,
                }
            )
        self._span.end()

    def _access_line(
        self, status: int, outcome: str, duration_s: float, ttft_s: float | None
    ) -> None:
        # One line per request: built as one string and handed to the handlers without
        # `Logger.info`'s caller lookup and %-formatting (the logger's level and filters
        # still apply). The formats print neither the caller nor the process.
        if not access_log.isEnabledFor(logging.INFO):
            return
        queue_ms, ttft_ms, duration_ms = _ms(self._queued_s), _ms(ttft_s), _ms(duration_s)
        fields = {
            "request_id": self.request_id,
            "tenant": self.tenant,
            "deployment": self.deployment,
            "version": self.version,
            "endpoint": self.endpoint,
            "status": status,
            "outcome": outcome,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "queue_ms": queue_ms,
            "ttft_ms": ttft_ms,
            "duration_ms": duration_ms,
        }
        message = (
            f"access tenant={self.tenant} deployment={self.deployment} version={self.version}"
            f" endpoint={self.endpoint} status={status} outcome={outcome}"
            f" prompt_tokens={self.prompt_tokens} completion_tokens={self.completion_tokens}"
            f" queue_ms={queue_ms} ttft_ms={ttft_ms} duration_ms={duration_ms}"
        )
        extra = {"fields": fields, "request_id": self.request_id}
        access_log.handle(
            access_log.makeRecord(
                access_log.name, logging.INFO, __file__, 0, message, (), None, "access", extra
            )
        )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)
