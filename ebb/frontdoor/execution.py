"""Running one request through the queue: admit, wait for a claim, follow its events.

The admission contract: a request is either claimed by a runner before its deadline, or
withdrawn by this module and refused with 503. Both are single atomic scripts on the
request's state, so a request is never both run and refused. A client that goes away is
withdrawn if still queued, or aborted in the engine if running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass

from starlette.requests import Request

from ebb.coldstart.estimate import retry_after_for
from ebb.config import Settings
from ebb.errors import CapacityError, JobError
from ebb.queue.platform import PlatformState
from ebb.queue.requests import EventReader, QueueFull, RequestQueue
from ebb.queue.schema import (
    Claimed,
    DeploymentSpec,
    Failed,
    Finished,
    Progress,
    WorkItem,
)

log = logging.getLogger(__name__)

# While a claimed request is running, how long to wait for an event before re-checking
# its recorded state (a safety net under the lease reaper, which normally reports loss).
_EVENT_SILENCE_S = 15.0


class ClientGone(Exception):
    pass


@dataclass
class Running:
    """A claimed request whose events are being followed."""

    work: WorkItem
    reader: EventReader
    queued_s: float


class Executor:
    def __init__(self, settings: Settings, queue: RequestQueue, state: PlatformState):
        self._settings = settings
        self._queue = queue
        self._state = state

    async def admit(self, work: WorkItem, spec: DeploymentSpec) -> Running:
        """Queue `work` and wait for a runner to claim it; raises CapacityError (503)."""
        window_s = spec.admission_timeout_s or self._settings.admission_timeout_s
        depth = spec.queue_depth_limit or self._settings.queue_depth_limit
        await self._refuse_if_failing(spec)
        started = time.monotonic()
        try:
            await self._queue.enqueue(work, admission_window_s=window_s, depth_limit=depth)
        except QueueFull as e:
            raise await self._capacity_error(
                spec,
                f"The queue of {spec.name!r} is full ({depth} waiting); retry later.",
                code="queue_full",
            ) from e
        reader = self._queue.events(work.request_id)
        event = await reader.next(timeout_s=window_s)
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
            event = await reader.next(timeout_s=_EVENT_SILENCE_S)
        if isinstance(event, Failed):
            raise JobError(event.message, code=event.code)
        if not isinstance(event, Claimed):
            raise JobError(f"unexpected first event {type(event).__name__}")
        return Running(work, reader, queued_s=time.monotonic() - started)

    async def events(self, running: Running) -> AsyncIterator[Progress | Finished | Failed]:
        """The request's events until its terminal one (Finished or Failed)."""
        while True:
            event = await running.reader.next(timeout_s=_EVENT_SILENCE_S)
            if event is None:
                state = await self._queue.request_state(running.work.request_id)
                if state.get("state") == "claimed":
                    continue  # still running (a long prefill, say); the reaper guards loss
                event = Failed(message="the request ended without a result", code="lost")
            if isinstance(event, Claimed):
                continue
            yield event
            if isinstance(event, Finished | Failed):
                return

    async def cancel(self, work: WorkItem) -> None:
        outcome = await self._queue.cancel(work)
        log.info("frontdoor: %s cancelled by client (%s)", work.request_id, outcome)

    async def _refuse_if_failing(self, spec: DeploymentSpec) -> None:
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
        retry = retry_after_for(
            spec.name,
            await self._state.runners(),
            await self._state.cold_start_ms(spec.name),
            fork_server_ready=await self._state.fork_server_state() == "ready",
            now_ms=time.time() * 1000,
        )
        return CapacityError(message, retry_after_s=retry, code=code)


async def unless_disconnected(
    request: Request, work: WorkItem, executor: Executor, task: Awaitable
):
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
