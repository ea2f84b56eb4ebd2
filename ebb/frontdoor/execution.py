"""Running one request through the queue: admit, wait for a claim, follow its events.

The admission contract: a request is either claimed by a runner before its deadline, or
withdrawn by this module and refused with 503. Both are single atomic scripts on the
request's state, so a request is never both run and refused. A client that goes away is
withdrawn if still queued, or aborted in the engine if running.

A request whose runner was lost goes on as a continuation (the reaper queues it again,
see reap.lua; `events` follows it through, the caller sees one output). One the reaper
could not continue (several choices, past EBB_CONTINUATIONS) runs again if its client saw
no output yet (`rerun`, same id: billed once). Following a request rides out a Redis
restart (retrying with backoff for EBB_REDIS_OUTAGE_S) before the unavailability reaches
the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import msgspec
from starlette.requests import Request

from ebb import backoff
from ebb.coldstart.estimate import retry_after_for
from ebb.config import Settings
from ebb.errors import CapacityError, JobError, NotFound
from ebb.frontdoor.priority import AdmissionPriority, shed_message
from ebb.queue.connection import UNAVAILABLE_ERRORS
from ebb.queue.event_hub import EventHub, HubReader
from ebb.queue.platform import PlatformState
from ebb.queue.priority_store import PriorityStore
from ebb.queue.requests import EventReader, QueueFull, QueueShed, RequestQueue
from ebb.queue.schema import (
    Claimed,
    Continued,
    DeploymentSpec,
    Failed,
    Finished,
    Progress,
    WorkItem,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

# While a claimed request is running, how long to wait for an event before re-checking
# its recorded state (a safety net under the lease reaper, which normally reports loss).
_EVENT_SILENCE_S = 15.0
# The shortest wait for an event as a request's wall-clock limit nears.
_MIN_WAIT_S = 0.01
# How long a cancelled request's access line waits for its runner's abort (the next engine
# step), for the token counts the ledger bills.
_ABORT_WAIT_S = 10.0
# Times one request runs again after losing its runner before the loss is its answer.
MAX_RERUNS = 2
_OUTAGE_BACKOFF_FIRST_S = 0.1
_OUTAGE_BACKOFF_MAX_S = 2.0
# How long one Retry-After estimate serves a deployment's refusals, and how many
# deployments' estimates are kept.
_RETRY_AFTER_FRESH_S = 1.0
_RETRY_AFTER_KEPT = 1024


class ClientGone(Exception):
    pass


@dataclass
class Running:
    """A claimed request whose events are being followed."""

    work: WorkItem
    reader: EventReader | HubReader
    queued_s: float
    spec: DeploymentSpec
    reruns: int = 0


class Executor:
    def __init__(
        self,
        settings: Settings,
        queue: RequestQueue,
        state: PlatformState,
        priorities: PriorityStore | None = None,
        hub: EventHub | None = None,
    ):
        """`hub`: follows every admitted request's events with shared reads (None: one
        XREAD per request each)."""
        self._settings = settings
        self._queue = queue
        self._hub = hub
        self._state = state
        self._retry_after = RetryAfterCache(state)
        self._priority = AdmissionPriority(priorities, settings.shed_queue_fraction)

    async def admit(
        self, work: WorkItem, spec: DeploymentSpec, status: dict[str, str] | None = None
    ) -> Running:
        """Queue `work` and wait for a runner to claim it; raises CapacityError (503).
        `status`: the deployment's status as just read with its spec (read here if not)."""
        window_s = spec.admission_timeout_s or self._settings.admission_timeout_s
        depth = spec.queue_depth_limit or self._settings.queue_depth_limit
        await self._refuse_if_failing(spec, status)
        # Bound to this deployment: a runner of a later one of the same name refuses it.
        work = msgspec.structs.replace(work, deployment_uid=spec.uid)
        work = await self._priority.stamp(work)
        started = time.monotonic()
        try:
            await self._queue.enqueue(
                work,
                admission_window_s=window_s,
                depth_limit=depth,
                shed_depth=self._priority.shed_depth(work, depth),
            )
        except QueueFull as e:
            raise await self._queue_full(spec, depth) from e
        except QueueShed as e:
            message = self._priority.shed_message(work, spec, depth)
            raise await self._capacity_error(spec, message, code="shed") from e
        reader = (
            self._hub.reader(work.request_id)
            if self._hub is not None
            else self._queue.events(work.request_id)
        )
        await self._await_claim(work, spec, reader, window_s)
        return Running(work, reader, queued_s=time.monotonic() - started, spec=spec)

    def forget_priorities(self) -> None:
        """A priority class was set through this frontdoor: its next requests read it."""
        self._priority.forget()

    async def stamp_priority(self, work: WorkItem) -> WorkItem:
        """`work` in its caller's priority class (its key's, else its tenant's): what an
        async job's attempts are queued in, as `admit` does for a synchronous request."""
        return await self._priority.stamp(work)

    async def refuse_if_full(
        self, spec: DeploymentSpec, queued: int, *, key_id: str = "", tenant: str = ""
    ) -> None:
        """CapacityError (503 queue_full) when `queued` requests already fill the queue,
        or (503 shed) when the caller (`key_id` of `tenant`) is sheddable and `queued`
        reached its shed depth: `admit` would refuse it, after the tokenizing."""
        depth = spec.queue_depth_limit or self._settings.queue_depth_limit
        if queued >= depth:
            raise await self._queue_full(spec, depth)
        shed_at = await self._priority.caller_shed_depth(key_id, tenant, depth)
        if shed_at and queued >= shed_at:
            message = shed_message(spec, shed_at, depth)
            raise await self._capacity_error(spec, message, code="shed")

    async def _queue_full(self, spec: DeploymentSpec, depth: int) -> CapacityError:
        return await self._capacity_error(
            spec,
            f"The queue of {spec.name!r} is full ({depth} waiting); retry later.",
            code="queue_full",
        )

    async def _await_claim(
        self,
        work: WorkItem,
        spec: DeploymentSpec,
        reader: EventReader | HubReader,
        window_s: float,
    ) -> None:
        """Until the request's next Claimed event; CapacityError once withdrawn unclaimed."""
        event = await self._ride_out(reader.next, window_s)
        while event is None:
            if await self._queue.withdraw(work):
                # Placement may have refused the runner while this request waited.
                await self._refuse_if_failing(spec)
                log.info(
                    "frontdoor: %s not admitted within %.1fs on %s",
                    work.request_id,
                    window_s,
                    spec.name,
                )
                raise await self._capacity_error(
                    spec,
                    f"No runner of {spec.name!r} could take the request within {window_s:g}s "
                    "(it is scaling up from zero or busy); retry after the indicated time.",
                    code="admission_timeout",
                )
            # Claimed at the deadline: its Claimed event is already on the stream.
            event = await self._ride_out(reader.next, _EVENT_SILENCE_S)
        if isinstance(event, Failed):
            if event.code == "deployment_deleted":
                raise NotFound(event.message, param="model", code=event.code)
            raise JobError(event.message, code=event.code)
        if not isinstance(event, Claimed):
            raise JobError(f"unexpected first event {type(event).__name__}")

    async def rerun(self, running: Running, failure: Failed) -> bool:
        """Run a request again whose runner was lost, if its client saw nothing yet (the
        caller's to know) and it has reruns left: True once another runner claimed it.

        The same request id runs again, so it is billed once. Raises CapacityError (503)
        when no runner takes it within the admission window."""
        if failure.code != "runner_lost" or running.reruns >= MAX_RERUNS:
            return False
        window_s = running.spec.admission_timeout_s or self._settings.admission_timeout_s
        if not await self._queue.rerun_lost(running.work, admission_window_s=window_s):
            return False
        running.reruns += 1
        log.warning(
            "frontdoor: %s lost its runner before any output; running it again (%d/%d)",
            running.work.request_id,
            running.reruns,
            MAX_RERUNS,
        )
        await self._await_claim(running.work, running.spec, running.reader, window_s)
        return True

    async def _ride_out(self, read: Callable[[float], Awaitable[T]], timeout_s: float) -> T:
        """`read(timeout_s)`, retried with backoff while Redis is unreachable, for at most
        EBB_REDIS_OUTAGE_S; then the unavailability propagates."""
        deadline = time.monotonic() + self._settings.redis_outage_s
        failures = 0
        while True:
            try:
                return await read(timeout_s)
            except UNAVAILABLE_ERRORS as e:
                failures += 1
                delay_s = backoff.delay_s(
                    failures, first_s=_OUTAGE_BACKOFF_FIRST_S, cap_s=_OUTAGE_BACKOFF_MAX_S
                )
                if time.monotonic() + delay_s > deadline:
                    raise
                log.warning("frontdoor: Redis unavailable (%s); retrying in %.1fs", e, delay_s)
                await asyncio.sleep(delay_s)

    async def events(self, running: Running) -> AsyncIterator[Progress | Finished | Failed]:
        """The request's events until its terminal one (Finished or Failed).

        A continuation (the reaper queued the request again after losing its runner, see
        reap.lua) is followed through: its Progress goes on from the next token, so the
        caller sees one uninterrupted output. One still running at its deployment's
        serving.max_request_s (from its arrival) is stopped in the engine and ends with a
        Failed event of code "request_timeout"."""
        limit_s = running.spec.serving.max_request_s
        # A work item made without its arrival time (0) counts from now.
        arrived_s = running.work.enqueued_at_s or time.time()
        deadline_s = arrived_s + limit_s if limit_s > 0 else math.inf
        while True:
            wait_s = min(_EVENT_SILENCE_S, max(_MIN_WAIT_S, deadline_s - time.time()))
            event = await self._ride_out(running.reader.next, wait_s)
            if event is None and time.time() >= deadline_s:
                yield await self._timed_out(running.work, limit_s)
                return
            if event is None:
                event = await self._after_silence(running)
                if event is None:
                    continue
            if isinstance(event, Claimed | Continued):
                continue
            yield event
            if isinstance(event, Finished | Failed):
                return

    async def _timed_out(self, work: WorkItem, limit_s: float) -> Failed:
        """Stop a request past its wall-clock limit (its runner aborts it at its next step,
        billing what it generated, as for a client that left)."""
        outcome = await self._queue.cancel(work)
        log.warning(
            "frontdoor: %s stopped at its %.0f s limit (%s)", work.request_id, limit_s, outcome
        )
        return Failed(
            message=f"The request ran for its deployment's limit of {limit_s:g} s "
            "(serving.max_request_s) and was stopped. Ask for fewer tokens (max_tokens), "
            "or stream to receive the output as it is generated.",
            code="request_timeout",
        )

    async def _after_silence(self, running: Running) -> Failed | None:
        """No event for a while: None while the request runs (a long prefill, say; the
        reaper guards loss) or waits as a continuation within its deadline; else why it
        ended without a result."""
        work = running.work
        state = await self._ride_out(lambda _: self._queue.request_state(work.request_id), 0)
        if state.get("state") == "claimed":
            return None
        if state.get("state") in ("queued", "expired") and state.get("continuations"):
            deadline_ms = int(state.get("deadline_ms") or 0)
            if state["state"] == "queued" and time.time() * 1000 < deadline_ms:
                return None
            if await self._queue.withdraw(work):
                return Failed(
                    message="The runner serving this request was lost mid-generation and "
                    "no other runner could continue it in time. Retry it.",
                    code="runner_lost",
                    retryable=True,
                )
            return None  # claimed at the deadline: its events follow
        return Failed(message="the request ended without a result", code="lost")

    async def cancel(self, work: WorkItem) -> None:
        outcome = await self._queue.cancel(work)
        log.info("frontdoor: %s cancelled by client (%s)", work.request_id, outcome)

    async def billed_counts(self, request_id: str) -> tuple[int, int] | None:
        """(prompt, completion) tokens a cancelled request was billed, once its runner
        has aborted it (None if it did not end within _ABORT_WAIT_S)."""
        return await self._queue.ended_counts(request_id, _ABORT_WAIT_S)

    async def _refuse_if_failing(
        self, spec: DeploymentSpec, status: dict[str, str] | None = None
    ) -> None:
        if status is None:
            status = await self._state.deployment_status(spec.name)
        if status.get("error"):
            raise await self._capacity_error(
                spec,
                f"Deployment {spec.name!r} cannot start a runner: {status['error']}",
                code="deployment_failing",
            )
        if status.get("unschedulable"):
            # The controller keeps checking and clears this once a GPU has room; the
            # refusal wakes it so that it checks now.
            await self._state.wake(spec.name)
            raise await self._capacity_error(
                spec,
                f"Deployment {spec.name!r} fits on no GPU: {status['unschedulable']}. "
                "Free GPU memory (scale other deployments down) or lower engine."
                "gpu_memory_gib / max_model_len.",
                code="deployment_unschedulable",
            )

    async def _capacity_error(self, spec: DeploymentSpec, message: str, code: str) -> CapacityError:
        retry = await self._retry_after.of(spec.name)
        return CapacityError(message, retry_after_s=retry, code=code)


class RetryAfterCache:
    """Each deployment's Retry-After for refusals, computed at most once per
    `_RETRY_AFTER_FRESH_S`: a burst of refusals (a full queue) then costs no Redis round
    trips beyond its enqueue attempt, and concurrent refusals share one computation. The
    estimate moves with runner states and cold-start averages, over seconds."""

    def __init__(self, state: PlatformState, clock: Callable[[], float] = time.monotonic):
        self._state = state
        self._clock = clock
        self._estimates: dict[str, tuple[float, asyncio.Task[int]]] = {}

    async def of(self, deployment: str) -> int:
        now = self._clock()
        known = self._estimates.get(deployment)
        if known is not None:
            at, task = known
            fresh = now - at < _RETRY_AFTER_FRESH_S
            if fresh and not (task.done() and task.exception() is not None):
                return await asyncio.shield(task)
        if len(self._estimates) > _RETRY_AFTER_KEPT:
            self._estimates.clear()  # deployments come and go; the next refusal recomputes
        task = asyncio.ensure_future(self._estimate(deployment))
        self._estimates[deployment] = (now, task)
        return await asyncio.shield(task)

    async def _estimate(self, deployment: str) -> int:
        return retry_after_for(
            deployment,
            await self._state.runners(),
            await self._state.cold_start_ms(deployment),
            fork_server_ready=await self._state.fork_server_state() == "ready",
            now_ms=time.time() * 1000,
        )


async def unless_disconnected(
    request: Request, work: WorkItem, executor: Executor, task: Awaitable[T]
) -> T:
    """Await `task`, cancelling the request in the queue if the client disconnects first."""
    job = asyncio.ensure_future(task)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if job in done:
            return job.result()
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await job
        await executor.cancel(work)
        raise ClientGone(work.request_id)
    finally:
        watcher.cancel()


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
