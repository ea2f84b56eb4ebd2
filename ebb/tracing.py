"""OpenTelemetry traces of requests, from the client's `traceparent` to the engine.

Off unless `EBB_OTLP_ENDPOINT` is set (`setup`): the API's tracer is then a no-op and no
`traceparent` is written into work items. When on, the frontdoor continues the client's
W3C trace context (or starts one), puts its own span's `traceparent` into the WorkItem,
and the runner that claims it parents its spans on it: one trace across processes,
through Redis. Spans, in order: `ebb.request` (frontdoor, the whole request) with
`ebb.admission` (arrival to enqueue); on the runner, `ebb.queue_wait` (enqueue to its
claim), `ebb.cold_start` with one child per phase when the request waited for that
start, `ebb.prefill` (claim to first token) and `ebb.decode` (first token to the end);
the webhooks worker's `ebb.webhook_delivery` per attempt. A job (POST /v1/jobs) has an
`ebb.job` span in place of `ebb.request`; its traceparent travels in the work item to
the runner and in each of its deliveries to the webhooks worker, so submission, attempts
and webhook deliveries are one trace (a batch's delivery is a trace of its own).

Spans measured after the fact are created with explicit start and end times (ns since
the epoch), so recording them costs one call when the request ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.sampling import Sampler

tracer = trace.get_tracer("ebb")
_propagator = TraceContextTextMapPropagator()


def setup(endpoint: str | None, service: str, *, sample_ratio: float = 1.0) -> None:
    """Export this process's spans to the OTLP/HTTP `endpoint`; nothing when it is None.

    `sample_ratio` of the traces that start here are recorded; a span with a parent
    (the client's traceparent, or the frontdoor's in a work item) follows the parent's
    decision, so a trace is recorded whole or not at all."""
    if not endpoint:
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(
        resource=Resource.create({"service.name": service}), sampler=sampler(sample_ratio)
    )
    exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def sampler(ratio: float) -> Sampler:
    """Parent-based: a trace's first span decides (`ratio` of them recorded), the rest of
    it, in every process, follows the sampled flag of its traceparent."""
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    return ParentBased(TraceIdRatioBased(ratio))


def active() -> bool:
    """Whether spans are recorded at all (an SDK tracer provider is installed)."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def context_from(headers: Mapping[str, str]) -> Context:
    """The W3C trace context a client sent (`traceparent`), or an empty one."""
    return _propagator.extract(dict(headers))


def traceparent_of(span: trace.Span) -> str:
    """The `traceparent` header value that makes `span` the parent of remote spans."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def _parent(traceparent: str) -> Context:
    return _propagator.extract({"traceparent": traceparent})


def record_span(
    name: str,
    parent: Context | str,
    start_ns: int,
    end_ns: int,
    attributes: Mapping[str, str | int | float] | None = None,
) -> trace.Span:
    """A finished span from `start_ns` to `end_ns` under `parent` (a context or a
    `traceparent` string); returned so children can be recorded under it."""
    context = _parent(parent) if isinstance(parent, str) else parent
    span = tracer.start_span(name, context=context, start_time=start_ns, attributes=attributes)
    span.end(end_time=end_ns)
    return span


def record_cold_start(
    traceparent: str, tier: str, start_ns: int, phases_ms: Mapping[str, float]
) -> None:
    """The cold start a request waited for: one span, its phases laid end to end."""
    total_ns = int(phases_ms.get("total", sum(phases_ms.values())) * 1e6)
    parent = record_span(
        "ebb.cold_start", traceparent, start_ns, start_ns + total_ns, {"tier": tier}
    )
    context = trace.set_span_in_context(parent)
    at_ns = start_ns
    for phase, ms in phases_ms.items():
        if phase == "total":
            continue
        record_span(f"ebb.cold_start.{phase}", context, at_ns, at_ns + int(ms * 1e6))
        at_ns += int(ms * 1e6)


def record_serving(
    traceparent: str,
    *,
    enqueued_ns: int,
    claimed_ns: int,
    first_output_ns: int | None,
    end_ns: int,
    prompt_tokens: int,
    completion_tokens: int,
) -> None:
    """Queue wait (enqueue to claim), prefill (claim to first output) and decode (first
    output to end) of a request a runner served."""
    first_ns = first_output_ns or end_ns
    parent = _parent(traceparent)  # parsed once for the three spans
    record_span("ebb.queue_wait", parent, min(enqueued_ns, claimed_ns), claimed_ns)
    record_span("ebb.prefill", parent, claimed_ns, first_ns, {"prompt_tokens": prompt_tokens})
    record_span("ebb.decode", parent, first_ns, end_ns, {"completion_tokens": completion_tokens})
