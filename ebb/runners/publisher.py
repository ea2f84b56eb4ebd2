"""Publishing a serving loop's output off its engine thread.

Each engine step's output (and the requests it completed) is one Redis round trip. Made
on the engine thread, that round trip sat between every two engine steps: on a 2-core
CPU host it took about a millisecond (Redis shares its core with the frontdoor that
streams the same tokens), some 2 % of a 55 ms decode step at concurrency 1. Here one
thread publishes while the engine thread claims and runs the next step, whose compute
releases the GIL.

A step's output may be held back (`submit(..., hold=True)`) until the loop has claimed
for the next step (`release()`): the claim, which the next step waits for, then reaches
Redis first instead of queueing behind the publish (and behind the frontdoor the publish
wakes). That costs the output the claim's round trip.

Order is kept: batches are published one at a time, in the order submitted, so a
request's output events stay in sequence and its ending comes after them. A batch that
fails stops the publisher: later batches are skipped (they would no longer be in order)
and the error is raised on the engine thread at each `submit` or `flush` after it, as it
would have been raised by a publish made there.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ebb.queue.runner_side import Ending
from ebb.queue.schema import Progress

Publish = Callable[[dict[str, Progress], list[Ending]], list[bool]]
# Called on the publisher's thread once the batch is out, with whether each ending was
# this runner's (see `RunnerQueue.publish`).
AfterPublish = Callable[[list[bool]], None]

# Batches waiting besides the one being published. The engine thread blocks on a full
# queue: when Redis falls behind, the runner slows down instead of holding output.
_BACKLOG = 2


@dataclass(frozen=True)
class _Batch:
    progress: dict[str, Progress]
    endings: list[Ending]
    then: AfterPublish | None


class OutputPublisher:
    """A thread that publishes batches in order, between `start()` and `stop()`. While
    it is not running, `submit` publishes on the caller's thread."""

    def __init__(self, publish: Publish) -> None:
        self._publish = publish
        self._batches: queue.Queue[_Batch | None] = queue.Queue(maxsize=_BACKLOG)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._held: _Batch | None = None  # goes out before anything submitted after it

    def start(self) -> None:
        if self._thread is not None:
            return
        self._error = None
        self._thread = threading.Thread(target=self._work, name="publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Publish what was submitted, then end the thread. Raises nothing: `flush` first
        to learn of a failed publish (`stop` also runs while another error unwinds)."""
        if self._thread is None:
            return
        if self._held is not None and self._error is None:
            self._batches.put(self._held)
        self._held = None
        self._batches.put(None)
        self._thread.join()
        self._thread = None
        self._error = None

    def submit(
        self,
        progress: dict[str, Progress],
        endings: list[Ending],
        then: AfterPublish | None = None,
        *,
        hold: bool = False,
    ) -> None:
        """Publish a batch after those submitted before it; with `hold`, not before
        `release()` (or the next `submit`, `flush` or `stop`)."""
        if self._thread is None:
            done = self._publish(progress, endings)
            if then is not None:
                then(done)
            return
        self.release()
        batch = _Batch(progress, endings, then)
        if hold:
            self._held = batch
        else:
            self._batches.put(batch)

    def release(self) -> None:
        """Hand the held batch, if any, to the thread; raises a publish's error."""
        self._raise_failure()
        if self._held is not None:
            held, self._held = self._held, None
            self._batches.put(held)

    def flush(self) -> None:
        """Wait until everything submitted is published (the held batch too); raises a
        publish's error."""
        if self._thread is not None:
            self.release()
            self._batches.join()
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error

    def _work(self) -> None:
        failed = False
        while True:
            batch = self._batches.get()
            try:
                if batch is None:
                    return
                if failed:
                    continue
                done = self._publish(batch.progress, batch.endings)
                if batch.then is not None:
                    batch.then(done)
            except BaseException as e:  # raised on the engine thread, see the docstring
                self._error, failed = e, True
            finally:
                self._batches.task_done()
