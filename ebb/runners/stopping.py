"""How a runner is told to stop, and how a stop reaches it while it imports or loads.

A stop is SIGTERM or SIGINT (its launcher draining it, `ebb up` stopping) or, launched
locally, its launcher gone (the heartbeat sees it). Serving and waiting as a stem look at
`RunnerStop.event` between steps. Importing and loading the engine run in the main thread
for seconds to minutes without looking at anything, so there the handler raises
`StopRequested` (as vLLM's own server does with KeyboardInterrupt while it initialises):
the load unwinds through its `finally`s at the next bytecode the main thread runs, and the
runner exits (see `process`). Only inside `interruptible()`: anywhere else (a write of the
runner's state to Redis, the serving loop) a stop waits to be looked at.

A C call that does not return to the interpreter until it is done (a blocking read of a
weights file, a CUDA or NCCL initialisation, one long kernel) is not interrupted: the
exception comes as it returns. That call's length is the worst case, bounded by the
launcher's kill after its grace (30 s locally).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import psutil

log = logging.getLogger(__name__)

# How long the engine's child processes get to end on SIGTERM before they are killed.
_CHILDREN_GRACE_S = 5.0


class StopRequested(BaseException):
    """A stop, raised in the main thread inside `RunnerStop.interruptible`. A
    BaseException, as KeyboardInterrupt: a library's `except Exception` lets it through."""


class RunnerStop:
    """The runner's stop: an event, and an exception while the main thread loads."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._interruptible = False

    def install(self) -> None:
        """Handle SIGTERM and SIGINT (from the main thread: Python runs handlers there)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def request(self) -> None:
        """Stop, from any thread: as a SIGTERM to the main thread, so that an import or a
        load there is interrupted as well (the event alone would wait for its end)."""
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.event.set()
        if self._interruptible:
            self._interruptible = False  # once: the unwinding is not interrupted again
            raise StopRequested(signal.Signals(signum).name)

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """Run the body so that a stop raises `StopRequested` in it (at once if the stop
        came before). It may also be raised as the block ends, after the body returned: a
        caller catches it around the whole `with`, and looks at `event` after it."""
        self._interruptible = True  # before the check: a stop between them still raises
        try:
            if self.event.is_set():
                raise StopRequested("stopped before")
            yield
        finally:
            self._interruptible = False


def caused_by_stop(error: BaseException) -> bool:
    """`error` is a `StopRequested`, or was raised while handling one (a library that
    cleaned up after it and raised its own)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, StopRequested):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def end_children() -> None:
    """End this process's child processes: what a load cut short started and no engine
    object owns yet (vLLM's workers). SIGTERM, then SIGKILL after a grace; reaped."""
    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=_CHILDREN_GRACE_S)
    for child in alive:
        log.warning("runner: child process %d did not end on SIGTERM, killing", child.pid)
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=_CHILDREN_GRACE_S)
