"""The engine watchdog: a runner whose engine stops stepping while it holds work dies.

The serving loop calls the engine on its thread, the heartbeat beats on its own. An
engine call that never returns (a deadlock inside the engine) leaves the heartbeat
beating and the held requests' leases renewed, so nothing else in the platform can tell
it from a long step, and its clients would wait for their own timeouts. So the serving
loop brackets each engine call (`EngineProgress.calling`), the heartbeat reports that
progress with every beat (the runner's record: `engine_steps`, `engine_busy_ms`) and
checks it (`Watchdog.check`): once one call has run for EBB_ENGINE_STALL_S, the runner
gives its requests up in one step (their leases expire now and the reaper's next pass
treats them as a lost runner's; the stall is counted; the runner is recorded failed)
and ends its process and its children hard: no engine call can be interrupted, and a
clean exit would wait for the call that never returns.

Time the loop spends outside the engine (Redis round trips, which ride out an outage on
their own) never counts: only a call into the engine can stall it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import NoReturn

import psutil

from ebb.queue.runner_side import RunnerQueue
from ebb.queue.schema import RunnerState
from ebb.runners.lifecycle import Lifecycle

log = logging.getLogger(__name__)

# The exit status of a runner its watchdog ended (EX_SOFTWARE): its launcher reports it;
# the runner's record already says why.
STALLED_EXIT_CODE = 70


class EngineProgress:
    """How the engine progresses, written by the serving thread and read by the heartbeat
    thread (single attribute stores and loads: atomic under the GIL)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.steps = 0  # engine steps completed since the runner loaded
        self._call_began: float | None = None  # when the call in progress began

    @contextlib.contextmanager
    def calling(self) -> Iterator[None]:
        """Around each call into the engine (a step, adding or aborting a request)."""
        self._call_began = self._clock()
        try:
            yield
        finally:
            self._call_began = None

    def stepped(self) -> None:
        self.steps += 1

    def busy_s(self) -> float:
        """How long the engine call in progress has run; 0 when none is."""
        began = self._call_began
        return 0.0 if began is None else max(0.0, self._clock() - began)


class Watchdog:
    """Calls `give_up` (once) when one engine call has run for `limit_s`."""

    def __init__(
        self, progress: EngineProgress, limit_s: float, give_up: Callable[[float], None]
    ) -> None:
        self._progress = progress
        self._limit_s = limit_s
        self._give_up = give_up
        self._fired = False

    def check(self) -> None:
        busy_s = self._progress.busy_s()
        if busy_s >= self._limit_s and not self._fired:
            self._fired = True
            self._give_up(busy_s)


def die_of_stall(
    queue: RunnerQueue,
    deployment: str,
    held_ids: Callable[[], list[str]],
    lifecycle: Lifecycle,
    limit_s: float,
    end: Callable[[], None] | None = None,
) -> Callable[[float], None]:
    """What the watchdog does: record the stall and give the held requests up (Redis
    permitting: the process ends either way), log every thread's stack (where the
    engine hung), then `end` the process (`kill_hard`)."""

    def give_up(busy_s: float) -> None:
        held = held_ids()
        error = (
            f"engine stalled: no step for {limit_s:g}s (one engine call ran {busy_s:.1f}s) "
            f"with {len(held)} requests held; killed by its watchdog (EBB_ENGINE_STALL_S)"
        )
        log.error("runner: %s %s", queue.runner_id, error)
        try:
            expired = queue.record_engine_stall(deployment, held, error)
            log.error("runner: %s gave %d requests up", queue.runner_id, expired)
            if lifecycle.state.is_live:
                lifecycle.adopt(RunnerState.FAILED, error=error)  # logged, readiness off
        except Exception:  # Redis away too: the leases run out on their own
            log.exception("runner: %s could not record its stall", queue.runner_id)
        _log_where_threads_are()  # the engine thread's stack says where it hung
        (end or kill_hard)()

    return give_up


def _log_where_threads_are() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    with contextlib.suppress(Exception):  # no usable stderr: nothing to say it on
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def kill_hard() -> NoReturn:
    """End this process now, and its children (an engine's workers) first."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(STALLED_EXIT_CODE)
