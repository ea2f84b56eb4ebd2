"""A runner's serving loop in-process, one layer below `ebb up`.

The real `ServingLoop` drives the fake engine against a real Redis (the integration tests'
redis-server) in burst mode: it serves what is queued and returns instead of waiting for
more work. Tests queue work through the frontdoor's own queue API (`RequestQueue`,
`JobStore`) and assert on what the frontdoor would see: events, usage, leases, request and
runner states. No subprocess, no controller:

    async with serving_harness(redis_url, max_concurrency=4) as h:
        work = await h.submit(max_tokens=12)
        assert await h.serve() is Outcome.IDLE
        assert text_of(await h.events(work.request_id)) == FAKE_REPLY[:12]

The loop's clock is a `ManualClock` (idle timeouts pass when a test says so); the loop
runs in a worker thread, as in a runner, so the test's event loop stays free to act on
the queue while it serves (`start()`, then await the task).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import redis

from ebb.queue import keys
from ebb.queue.connection import async_client, sync_client
from ebb.queue.job_schema import JobEvent, JobRecord, attempt_request_id
from ebb.queue.job_store import JobStore
from ebb.queue.platform import PlatformState
from ebb.queue.priority import engine_batch_limit
from ebb.queue.requests import RequestQueue
from ebb.queue.runner_side import RunnerQueue
from ebb.queue.schema import (
    DeploymentSpec,
    Failed,
    Finished,
    Progress,
    RequestEvent,
    RunnerRecord,
    RunnerState,
    SamplingSpec,
    UsageRecord,
    WorkItem,
    decode_event,
)
from ebb.runners.engine import EngineOptions
from ebb.runners.heartbeat import Heartbeat
from ebb.runners.lifecycle import Lifecycle
from ebb.runners.serve import Outcome, ServingLoop

# The one place the tests' harness names the fake engine's module.
from ebb.testing.fake_engine import FakeEngine
from ebb.testing.fake_model import FAKE_REPLY
from support import wait_until

__all__ = ["FAKE_REPLY", "DEP", "ManualClock", "ServingHarness", "serving_harness", "text_of"]

DEP = "dep-h"
PROMPT_TOKEN_IDS = [1, 2, 3]


class ManualClock:
    """The loop's monotonic clock; moves only when a test says so."""

    def __init__(self) -> None:
        self.now_s = 1000.0
        self._jump_s = 0.0

    def __call__(self) -> float:
        now_s, self.now_s, self._jump_s = self.now_s, self.now_s + self._jump_s, 0.0
        return now_s

    def jump_after_next_read(self, seconds: float) -> None:
        """The next read returns the current time, every later one `seconds` more: the
        loop starts (reading the clock once), then finds itself idle for `seconds`."""
        self._jump_s = seconds


class ObservedEngine(FakeEngine):
    """The fake engine, recording which requests each step ran (the batch); with
    `breaks_at_step` set, that step raises as a broken engine would."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.running: set[str] = set()
        self.batches: list[frozenset[str]] = []
        self.breaks_at_step: int | None = None

    def add_request(
        self, request_id: str, prompt_token_ids, sampling, continued=0, priority=1, **options
    ) -> None:
        super().add_request(request_id, prompt_token_ids, sampling, continued, priority, **options)
        self.running.add(request_id)

    def abort(self, request_ids: Iterable[str]) -> None:
        request_ids = list(request_ids)
        super().abort(request_ids)
        self.running.difference_update(request_ids)

    def step(self):
        if len(self.batches) == self.breaks_at_step:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        self.batches.append(frozenset(self.running))
        outputs = super().step()
        self.running.difference_update(o.request_id for o in outputs if o.finished)
        return outputs


class HookedRunnerQueue(RunnerQueue):
    """The runner's queue with one test hook: `before_drain` runs (once) just before the
    loop asks to drain, where a request arriving at that instant races the drain."""

    before_drain: Callable[[], None] | None = None

    def try_drain(self, deployment: str) -> bool:
        hook, self.before_drain = self.before_drain, None
        if hook is not None:
            hook()
        return super().try_drain(deployment)


@dataclass
class ServingHarness:
    spec: DeploymentSpec
    loop: ServingLoop
    engine: ObservedEngine
    runner: HookedRunnerQueue
    requests: RequestQueue
    jobs: JobStore
    platform: PlatformState
    redis: redis.Redis
    clock: ManualClock
    stop: threading.Event
    first_outputs: list[WorkItem] = field(default_factory=list)
    _ids: itertools.count = field(default_factory=itertools.count)
    _tasks: list[asyncio.Task] = field(default_factory=list)

    # --- the frontdoor's side: queue work ------------------------------------------------

    async def submit(self, max_tokens: int = 8, *, request_id: str = "", **fields) -> WorkItem:
        """Queue a synchronous request as the frontdoor does; `fields` go to the
        SamplingSpec, or to the WorkItem (tenant, key_id, prices)."""
        sampling = {k: fields.pop(k) for k in list(fields) if k in SamplingSpec.__struct_fields__}
        work = WorkItem(
            request_id=request_id or f"req-{next(self._ids)}",
            deployment=self.spec.name,
            prompt_token_ids=PROMPT_TOKEN_IDS,
            sampling=SamplingSpec(max_tokens=max_tokens, **sampling),
            **fields,
        )
        await self.requests.enqueue(work, admission_window_s=60, depth_limit=10_000)
        return work

    async def submit_job(self, job_id: str, max_tokens: int = 8, *, url: str = "") -> JobRecord:
        """Queue an async job's first attempt as the frontdoor does."""
        work = WorkItem(
            request_id=attempt_request_id(job_id, 1),
            deployment=self.spec.name,
            prompt_token_ids=PROMPT_TOKEN_IDS,
            sampling=SamplingSpec(max_tokens=max_tokens),
            job_id=job_id,
        )
        record = JobRecord(
            job_id=job_id,
            tenant="acme",
            deployment=self.spec.name,
            endpoint="completions",
            work=work,
            request_id=work.request_id,
            webhook_url=url,
            webhook_events=list(JobEvent) if url else [],
        )
        await self.jobs.submit(record, ttl_s=3600, idempotency_digest="", submission_digest="x")
        return record

    def submit_before_drain(self, max_tokens: int = 3, *, job_id: str = "") -> asyncio.Future:
        """Queue a request (or, with `job_id`, a job) from the loop's thread the instant
        before the loop asks to drain; the future gives its WorkItem."""
        main_loop = asyncio.get_running_loop()
        arrived: asyncio.Future[WorkItem] = main_loop.create_future()

        async def submit() -> WorkItem:
            if job_id:
                return (await self.submit_job(job_id, max_tokens)).work
            return await self.submit(max_tokens)

        def arrive() -> None:
            work = asyncio.run_coroutine_threadsafe(submit(), main_loop).result(10)
            main_loop.call_soon_threadsafe(arrived.set_result, work)

        self.runner.before_drain = arrive
        return arrived

    # --- the runner's side: serve ---------------------------------------------------------

    async def serve(self, *, idle_s: float = 0.0, timeout_s: float = 30) -> Outcome:
        """Run the loop in burst mode until it is idle, drained or asleep; with `idle_s`,
        the loop's clock moves on by that much once the loop has started, so an idle
        runner's first idle check sees `idle_s` without work."""
        self.clock.jump_after_next_read(idle_s)
        return await asyncio.wait_for(self.start(), timeout_s)

    def start(self) -> asyncio.Task[Outcome]:
        """The same as `serve`, running while the test goes on; await the task."""
        task = asyncio.create_task(asyncio.to_thread(self.loop.run, burst=True))
        self._tasks.append(task)
        return task

    async def wait_running(self, request_id: str, timeout_s: float = 10) -> None:
        """Until the engine is generating `request_id`."""
        await asyncio.to_thread(
            wait_until,
            lambda: any(request_id in batch for batch in self.engine.batches[-1:]),
            timeout_s,
            f"{request_id} to run in the engine",
            poll_s=0.005,
        )

    # --- what the frontdoor would see -----------------------------------------------------

    async def events(self, request_id: str, timeout_s: float = 10) -> list[RequestEvent]:
        """The request's events up to and including its terminal one."""
        reader = self.requests.events(request_id)
        events: list[RequestEvent] = []
        while not events or not isinstance(events[-1], Finished | Failed):
            event = await reader.next(timeout_s)
            assert event is not None, f"{request_id}: no terminal event after {events}"
            events.append(event)
        return events

    def all_events(self, request_id: str) -> list[RequestEvent]:
        """Every event on the request's stream, also those after a terminal one."""
        entries = self.redis.xrange(keys.events(request_id))
        return [decode_event(fields[b"e"]) for _, fields in entries]

    async def state(self, request_id: str) -> dict[str, str]:
        return await self.requests.request_state(request_id)

    async def usage(self) -> list[UsageRecord]:
        return await self.platform.usage_records()

    def leases(self) -> list[str]:
        return [member.decode() for member in self.redis.zrange(keys.LEASES, 0, -1)]

    def runner_state(self) -> RunnerState | None:
        record = self.runner.record()
        return record.state if record else None


def text_of(events: list[RequestEvent], index: int = 0) -> str:
    """What choice `index` said, across the request's Progress events."""
    return "".join(
        c.text for e in events if isinstance(e, Progress) for c in e.choices if c.index == index
    )


@asynccontextmanager
async def serving_harness(
    redis_url: str,
    *,
    source: str = "fake://m?step_ms=0",
    runner_id: str = "r-h",
    lease_ttl_s: float = 5.0,
    heartbeat_s: float | None = None,
    **spec_fields,
) -> AsyncIterator[ServingHarness]:
    """A READY runner of deployment DEP (registered in Redis as the controller would have
    it) with its serving loop, not yet running; with `heartbeat_s`, the runner's own
    heartbeat thread keeps its leases alive meanwhile."""
    client = async_client(redis_url)
    platform = PlatformState(client)
    spec = DeploymentSpec(name=DEP, source=source, **spec_fields)
    await platform.put_deployment(spec)
    runner = HookedRunnerQueue(
        sync_client(redis_url), runner_id, lease_ttl_s=lease_ttl_s, result_ttl_s=60
    )
    runner.register(RunnerRecord(runner_id=runner_id, state=RunnerState.READY, deployment=DEP))
    # The batch limit a runner gives its engine (ebb.runners.loading.engine_options).
    batch = engine_batch_limit(spec.max_concurrency, spec.engine.max_num_seqs)
    engine = ObservedEngine.load(
        EngineOptions(model_path=None, max_model_len=2048, source=source, max_num_seqs=batch)
    )
    stop, clock = threading.Event(), ManualClock()
    loop = ServingLoop(runner, engine, spec, stop, Lifecycle(runner, RunnerState.READY), clock)
    harness = ServingHarness(
        spec=spec,
        loop=loop,
        engine=engine,
        runner=runner,
        requests=RequestQueue(client, request_ttl_s=60),
        jobs=JobStore(client, retention_s=3600, result_ttl_s=60),
        platform=platform,
        redis=redis.Redis.from_url(redis_url),
        clock=clock,
        stop=stop,
    )
    loop.on_first_output = harness.first_outputs.append
    heartbeat = None
    if heartbeat_s is not None:
        heartbeat = Heartbeat(runner, heartbeat_s, stop)
        heartbeat.held_ids = loop.held_ids
        heartbeat.start()
    try:
        yield harness
    finally:
        stop.set()  # a loop a failed test left running drains and returns
        await asyncio.gather(*harness._tasks, return_exceptions=True)
        if heartbeat is not None:
            # Not joined: Heartbeat's own `_stop` event shadows Thread._stop, which join()
            # calls; the daemon thread ends at its next beat.
            heartbeat.done.set()
        harness.redis.close()
        await client.aclose()
