"""One request's trace, in-process with an in-memory span exporter: the frontdoor (its
ASGI app) and a runner's serving loop (a thread) on a real Redis. The client's
`traceparent` reaches the runner through the work item in Redis; the spans come in order
under one trace id, the cold start the request waited for included. A job's trace goes on
into the webhooks worker (collector and deliverer, in-process) up to its deliveries."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support import temp_home, wait_until
from support.webhook_receiver import Receiver

from ebb.config import Settings
from ebb.frontdoor.app import create_app
from ebb.launching.tiers import Tier
from ebb.queue.connection import async_client, sync_client
from ebb.queue.delivery_store import DeliveryStore
from ebb.queue.job_store import JobStore
from ebb.queue.platform import PlatformState
from ebb.queue.runner_side import RunnerQueue
from ebb.queue.schema import DeploymentSpec, RunnerRecord, RunnerState
from ebb.queue.webhook_secrets import WebhookSecrets
from ebb.runners.cold_start_clock import ColdStartClock
from ebb.runners.engine import EngineOptions
from ebb.runners.lifecycle import Lifecycle
from ebb.runners.process import _become_ready
from ebb.runners.serve import ServingLoop
from ebb.testing.fake_engine import FakeEngine
from ebb.webhooks.collector import JobCollector
from ebb.webhooks.sender import Deliverer

pytestmark = pytest.mark.integration

SOURCE = "fake://traced?step_ms=1"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def _deploy(redis_url: str, spec: DeploymentSpec) -> None:
    async def put() -> None:
        client = async_client(redis_url)
        await PlatformState(client).put_deployment(spec)
        await client.aclose()

    asyncio.run(put())


def test_one_request_is_one_trace_from_the_client_through_redis_to_the_runner(redis_url, spans):
    spans.clear()
    settings = Settings(redis_url=redis_url, admin_key="ebb-admin-trace", home=temp_home("ebb-tr-"))
    spec = DeploymentSpec(name="traced", source=SOURCE, created_at_s=time.time())
    _deploy(redis_url, spec)
    queue = RunnerQueue(sync_client(redis_url), "rtraced", lease_ttl_s=30, result_ttl_s=60)
    queue.register(
        RunnerRecord(runner_id="rtraced", state=RunnerState.LOADING, deployment="traced")
    )
    engine = FakeEngine.load(EngineOptions(model_path=None, max_model_len=2048, source=SOURCE))
    stop = threading.Event()
    headers = {
        "Authorization": "Bearer ebb-admin-trace",
        "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
    }
    body = {"model": "traced", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    answers = []
    with TestClient(create_app(settings)) as client:
        sender = threading.Thread(
            target=lambda: answers.append(
                client.post("/v1/chat/completions", json=body, headers=headers)
            )
        )
        sender.start()
        # The request waits in the queue while "its" runner starts: a cold start it pays for.
        wait_until(lambda: queue._redis.zcard("ebb:q:traced") == 1, 10, "the request queued")
        clock = ColdStartClock(time.time() * 1000 - 50)
        clock.lap("spawn")
        clock.lap("engine")
        lifecycle = Lifecycle(queue, RunnerState.LOADING)
        loop = ServingLoop(queue, engine, spec, stop, lifecycle)
        loop.on_first_output = _become_ready(lifecycle, queue, "traced", Tier.FRESH, clock)
        runner = threading.Thread(target=loop.run)
        runner.start()
        sender.join(timeout=30)
        stop.set()
        runner.join(timeout=30)
    assert answers and answers[0].status_code == 200, answers

    finished = sorted(spans.get_finished_spans(), key=lambda s: (s.start_time, s.name))
    names = [s.name for s in finished]
    assert {s.context.trace_id for s in finished} == {int(CLIENT_TRACE, 16)}, names
    by_name = {s.name: s for s in finished}
    request = by_name["ebb.request"]
    assert request.parent.span_id == int(CLIENT_SPAN, 16)
    order = ["ebb.admission", "ebb.queue_wait", "ebb.prefill", "ebb.decode"]
    assert [n for n in names if n in order] == order
    for earlier, later in zip(order, order[1:], strict=False):
        assert by_name[earlier].end_time <= by_name[later].start_time
    for name in (*order, "ebb.cold_start"):
        assert by_name[name].parent.span_id == request.context.span_id, name
    cold = by_name["ebb.cold_start"]
    phases = [s for s in finished if s.name.startswith("ebb.cold_start.")]
    assert [s.name for s in phases] == ["ebb.cold_start.spawn", "ebb.cold_start.engine"]
    assert all(s.parent.span_id == cold.context.span_id for s in phases)
    assert cold.attributes["tier"] == "fresh"
    assert request.attributes["ebb.completion_tokens"] == 4
    assert request.start_time <= by_name["ebb.admission"].start_time
    assert by_name["ebb.decode"].end_time <= request.end_time


def test_a_job_is_one_trace_from_submission_to_its_webhook_deliveries(redis_url, spans):
    """The job's traceparent travels with it: through Redis to the runner, and from the
    job into each of its deliveries, so the webhooks worker's delivery spans sit in the
    client's trace after the runner's."""
    spans.clear()
    settings = Settings(
        redis_url=redis_url,
        admin_key="ebb-admin-trace",
        home=temp_home("ebb-trj-"),
        webhook_allowed_cidrs="127.0.0.0/8",
    )
    spec = DeploymentSpec(name="traced", source=SOURCE, created_at_s=time.time())
    _deploy(redis_url, spec)
    queue = RunnerQueue(sync_client(redis_url), "rjob", lease_ttl_s=30, result_ttl_s=60)
    queue.register(RunnerRecord(runner_id="rjob", state=RunnerState.READY, deployment="traced"))
    engine = FakeEngine.load(EngineOptions(model_path=None, max_model_len=2048, source=SOURCE))
    receiver = Receiver().start()
    stop = threading.Event()
    headers = {
        "Authorization": "Bearer ebb-admin-trace",
        "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
    }
    job = {
        "model": "traced",
        "endpoint": "chat.completions",
        "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        "webhook": {"url": receiver.url},
    }
    try:
        with TestClient(create_app(settings)) as client:
            submitted = client.post("/v1/jobs", json=job, headers=headers)
            assert submitted.status_code == 202, submitted.text
            job_id = submitted.json()["id"]
            loop = ServingLoop(queue, engine, spec, stop, Lifecycle(queue, RunnerState.READY))
            runner = threading.Thread(target=loop.run)
            runner.start()
            try:
                asyncio.run(_collect_and_deliver(redis_url, settings, receiver))
            finally:
                stop.set()
                runner.join(timeout=30)
    finally:
        receiver.stop()
    assert {r.event for r in receiver.received} == {"job.started", "job.succeeded"}

    finished = sorted(spans.get_finished_spans(), key=lambda s: (s.start_time, s.name))
    names = [s.name for s in finished]
    assert {s.context.trace_id for s in finished} == {int(CLIENT_TRACE, 16)}, names
    submission = next(s for s in finished if s.name == "ebb.job")
    assert submission.parent.span_id == int(CLIENT_SPAN, 16)
    assert submission.attributes["ebb.job_id"] == job_id
    deliveries = [s for s in finished if s.name == "ebb.webhook_delivery"]
    assert sorted(s.attributes["ebb.job_id"] for s in deliveries) == [job_id, job_id]
    by_name = {s.name: s for s in finished}
    order = ["ebb.admission", "ebb.queue_wait", "ebb.prefill", "ebb.decode"]
    assert [n for n in names if n in order] == order
    for earlier, later in zip(order, order[1:], strict=False):
        assert by_name[earlier].end_time <= by_name[later].start_time
    # The delivery of the job's result starts after the runner finished it.
    succeeded = max(deliveries, key=lambda s: s.start_time)
    assert by_name["ebb.decode"].end_time <= succeeded.start_time
    for span in (*(by_name[n] for n in order), *deliveries):
        assert span.parent.span_id == submission.context.span_id, span.name


async def _collect_and_deliver(redis_url: str, settings: Settings, receiver: Receiver) -> None:
    """The webhooks worker's two halves, in this process: collect the job, deliver its
    events, until the receiver has both."""
    client = async_client(redis_url)
    jobs = JobStore(client, retention_s=settings.job_retention_s, result_ttl_s=60)
    collector = JobCollector(jobs, settings)
    store = DeliveryStore(client, record_ttl_s=600)
    async with httpx.AsyncClient(follow_redirects=False, trust_env=False) as http:
        deliverer = Deliverer(store, WebhookSecrets(client), settings, http)
        deadline = time.monotonic() + 30
        while len({r.event for r in receiver.received}) < 2:
            assert time.monotonic() < deadline, f"deliveries: {receiver.received}"
            await collector.pass_once()
            await deliverer.dispatch_due()
            await jobs.wait_for_activity(0.05)  # woken by the runner's claim or end
        await deliverer.drain(grace_s=10)
    await client.aclose()
