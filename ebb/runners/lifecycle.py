"""A runner's lifecycle as one state machine.

    STARTING -> PREWARMED -> LOADING -> READY -> DRAINING -> EXITED
         \\____________________/         |   ^
       (a fresh start skips PREWARMED)    v   |   (engines with sleep mode: GPUs)
                                        SLEEPING -> EXITED
    any live state -> FAILED

State and timestamps live in the runner's Redis record, so the controller, the frontdoor and
`ebb status` all see the same thing; every transition is logged with the prefix
"lifecycle:" and appended to the runner's log tail (shown when a deployment fails).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ebb.queue.runner_side import RunnerQueue
from ebb.queue.schema import RunnerState

log = logging.getLogger(__name__)

S = RunnerState
ALLOWED: dict[RunnerState, frozenset[RunnerState]] = {
    S.STARTING: frozenset({S.PREWARMED, S.LOADING, S.EXITED, S.FAILED}),
    S.PREWARMED: frozenset({S.LOADING, S.EXITED, S.FAILED}),
    S.LOADING: frozenset({S.READY, S.EXITED, S.FAILED}),
    S.READY: frozenset({S.DRAINING, S.SLEEPING, S.FAILED}),
    S.SLEEPING: frozenset({S.READY, S.DRAINING, S.EXITED, S.FAILED}),
    S.DRAINING: frozenset({S.EXITED, S.FAILED}),
    S.EXITED: frozenset(),
    S.FAILED: frozenset(),
}


class InvalidTransition(RuntimeError):
    pass


def can_transition(current: RunnerState, new: RunnerState) -> bool:
    return new in ALLOWED[current]


class Lifecycle:
    """The runner process's own view of its state; the only writer of its transitions."""

    def __init__(
        self,
        queue: RunnerQueue,
        state: RunnerState = RunnerState.STARTING,
        *,
        on_change: Callable[[RunnerState], None] | None = None,
    ):
        """`on_change`: told of every transition once it is recorded (a pod's readiness)."""
        self._queue = queue
        self.state = state
        self._on_change = on_change

    def to(self, new: RunnerState, *, error: str = "", **fields: object) -> None:
        self._check(new)
        now_ms = int(time.time() * 1000)
        if new is RunnerState.READY:
            fields["ready_ms"] = now_ms
        if not new.is_live:
            fields["exited_ms"] = now_ms
            self._queue.leave_pool()
        if error:
            fields["error"] = error[:500]
        self._queue.set_fields(state=new, **fields)
        self._record(new, error)

    def adopt(self, new: RunnerState, *, error: str = "") -> None:
        """A Lua script already wrote this transition atomically; track and log it."""
        self._check(new)
        self._record(new, error)

    def _check(self, new: RunnerState) -> None:
        if not can_transition(self.state, new):
            raise InvalidTransition(f"runner cannot go from {self.state} to {new}")

    def _record(self, new: RunnerState, error: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {self.state.value} -> {new.value}"
        self._queue.append_log(f"{line}: {error}" if error else line)
        suffix = f" ({error})" if error else ""
        log.info(
            "lifecycle: %s %s -> %s%s", self._queue.runner_id, self.state.value, new.value, suffix
        )
        self.state = new
        if self._on_change is not None:
            self._on_change(new)

    def fail(self, error: str) -> None:
        """Record a failure from wherever the runner is; a no-op once it already ended."""
        if self.state.is_live:
            self.to(RunnerState.FAILED, error=error)
