"""EBB_OTLP_SAMPLE_RATIO: the first span of a trace decides, and every later span (in the
runner, from the work item's traceparent) follows it, so a trace is whole or absent."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ebb import tracing
from ebb.config import Settings

SAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _tracer(ratio: float):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=tracing.sampler(ratio))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def _hop(tracer, parent_traceparent: str | None) -> list[str]:
    """A frontdoor span (under the client's traceparent, if any) and a runner span under
    the frontdoor's traceparent, as the work item carries it."""
    context = tracing.context_from(
        {"traceparent": parent_traceparent} if parent_traceparent else {}
    )
    front = tracer.start_span("ebb.request", context=context)
    runner_context = tracing.context_from({"traceparent": tracing.traceparent_of(front)})
    tracer.start_span("ebb.decode", context=runner_context).end()
    front.end()


def test_ratio_zero_records_no_trace_of_its_own_not_even_the_runners_half():
    tracer, exporter = _tracer(0.0)
    _hop(tracer, None)
    assert exporter.get_finished_spans() == ()


def test_a_client_that_samples_its_trace_is_followed_whatever_the_ratio():
    tracer, exporter = _tracer(0.0)
    _hop(tracer, SAMPLED)
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["ebb.decode", "ebb.request"]
    assert {s.context.trace_id for s in spans} == {int(SAMPLED.split("-")[1], 16)}


def test_ratio_one_records_every_trace_and_the_default_is_one():
    tracer, exporter = _tracer(1.0)
    _hop(tracer, None)
    assert len(exporter.get_finished_spans()) == 2
    assert Settings(admin_key="x").otlp_sample_ratio == 1.0
