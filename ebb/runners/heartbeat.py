"""The runner's heartbeat thread: its liveness, its requests' leases, its engine's
progress, and (launched locally) its parent's."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from ebb.queue.runner_side import RunnerQueue
from ebb.runners import stall

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    """Keeps the runner's liveness and its leases fresh while the main thread computes.

    With `follow_parent` (local launches) it also stops the runner when its parent (the
    controller) is gone, so no runner outlives the platform that launched it. Without it
    the runner belongs to the cluster: its heartbeat in Redis is all that says it lives.
    """

    def __init__(
        self,
        queue: RunnerQueue,
        interval_s: float,
        stop: threading.Event,
        *,
        follow_parent: bool = True,
        on_orphaned: Callable[[], None] | None = None,
    ):
        """`on_orphaned`: how it stops the runner once its parent is gone (the runner's
        `RunnerStop.request`, which also interrupts a load); by default it sets `stop`."""
        super().__init__(name="heartbeat", daemon=True)
        self._queue = queue
        self._interval_s = interval_s
        # Not `_stop`: threading.Thread has a method of that name, used by join().
        self._stop_runner = stop
        self._on_orphaned = on_orphaned or stop.set
        self.done = threading.Event()
        self._parent = os.getppid() if follow_parent else None
        self.held_ids: Callable[[], list[str]] = lambda: []
        # The serving loop's engine, reported with each beat and watched (`stall`).
        self.progress = stall.EngineProgress()
        self.watchdog: Callable[[], None] = lambda: None
        # Told at each beat whether the runner held requests or stepped since the last one.
        self.on_beat: Callable[[bool], None] = lambda holding: None
        self._steps_seen = 0

    def run(self) -> None:
        while not self.done.wait(self._interval_s):
            orphaned = self._parent is not None and os.getppid() != self._parent
            if orphaned and not self._stop_runner.is_set():
                log.warning("runner: parent %d is gone, draining", self._parent)
                self._on_orphaned()
            self.watchdog()  # before renewing the leases of requests a hung engine holds
            held = self.held_ids()
            steps, self._steps_seen = self._steps_seen, self.progress.steps
            self.on_beat(bool(held) or steps != self._steps_seen)
            try:
                self._queue.heartbeat(
                    held,
                    engine_steps=self.progress.steps,
                    engine_busy_ms=round(self.progress.busy_s() * 1000),
                )
            except Exception:  # a Redis blip must not kill the runner; leases outlast one
                log.exception("runner: heartbeat failed")
