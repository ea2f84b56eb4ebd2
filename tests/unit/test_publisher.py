"""OutputPublisher: a serving loop's output, published in order off the engine thread."""

from __future__ import annotations

import threading

import pytest

from ebb.queue.runner_side import Ending
from ebb.queue.schema import ChoiceDelta, Finished, Progress, SamplingSpec, WorkItem
from ebb.runners.publisher import OutputPublisher


def _progress(request_id: str, seq: int) -> dict[str, Progress]:
    delta = ChoiceDelta(index=0, text=f"t{seq}", token_count=1)
    return {request_id: Progress(choices=[delta], seq=seq)}


def _ending(request_id: str) -> Ending:
    work = WorkItem(
        request_id=request_id,
        deployment="dep",
        prompt_token_ids=[1],
        sampling=SamplingSpec(max_tokens=1),
        enqueued_at_s=0.0,
    )
    return Ending(work, "finished", Finished(1, 1), 1, 1)


class RecordingPublish:
    """Records each batch and the thread that published it; the first batch waits for
    `release` (a Redis round trip that is slow to come back)."""

    def __init__(self, *, fail_on: int | None = None) -> None:
        self.batches: list[tuple[dict[str, Progress], list[Ending]]] = []
        self.threads: set[int] = set()
        self.release = threading.Event()
        self.first_started = threading.Event()
        self._fail_on = fail_on

    def __call__(self, progress: dict[str, Progress], endings: list[Ending]) -> list[bool]:
        if not self.batches:
            self.first_started.set()
            assert self.release.wait(10), "the test never released the first publish"
        self.threads.add(threading.get_ident())
        if self._fail_on == len(self.batches):
            self.batches.append((progress, endings))
            raise ConnectionError("Redis went away")
        self.batches.append((progress, endings))
        return [True] * len(endings)


def test_batches_are_published_in_order_on_another_thread_while_the_caller_goes_on() -> None:
    publish = RecordingPublish()
    publisher = OutputPublisher(publish)
    publisher.start()
    try:
        outs: list[list[bool]] = []
        publisher.submit(_progress("a", 1), [])
        assert publish.first_started.wait(10)
        # The first batch is still out; the caller is not held up by it.
        publisher.submit(_progress("a", 2), [_ending("a")], then=outs.append)
        assert publish.batches == [] and outs == []
        publish.release.set()
        publisher.flush()
        assert [list(p) + [e.work.request_id for e in es] for p, es in publish.batches] == [
            ["a"],
            ["a", "a"],
        ]
        assert [p["a"].seq for p, _ in publish.batches] == [1, 2]
        assert outs == [[True]]  # `then` ran once the batch was out, with its result
        assert threading.get_ident() not in publish.threads
    finally:
        publisher.stop()


def test_a_failed_publish_is_raised_to_the_caller_and_nothing_after_it_is_published() -> None:
    publish = RecordingPublish(fail_on=1)
    publish.release.set()
    publisher = OutputPublisher(publish)
    publisher.start()
    try:
        publisher.submit(_progress("a", 1), [])
        publisher.submit(_progress("a", 2), [])  # fails
        publisher.submit(_progress("b", 1), [])  # would be out of order: skipped
        with pytest.raises(ConnectionError, match="went away"):
            publisher.flush()
        with pytest.raises(ConnectionError):
            publisher.submit(_progress("b", 2), [])  # still failed: raised again
        assert [list(p) for p, _ in publish.batches] == [["a"], ["a"]]
    finally:
        publisher.stop()


def test_stopped_it_publishes_on_the_callers_thread_and_stop_publishes_what_was_left() -> None:
    publish = RecordingPublish()
    publish.release.set()
    publisher = OutputPublisher(publish)
    outs: list[list[bool]] = []
    publisher.submit({}, [_ending("a")], then=outs.append)
    assert publish.threads == {threading.get_ident()} and outs == [[True]]

    publisher.start()
    publisher.submit(_progress("b", 1), [])
    publisher.stop()  # out before the thread ends
    assert [list(p) for p, _ in publish.batches] == [[], ["b"]]
    assert len(publish.threads) == 2


def test_a_held_batch_goes_out_before_anything_submitted_after_it() -> None:
    publish = RecordingPublish()
    publish.release.set()
    publisher = OutputPublisher(publish)
    publisher.start()
    try:
        publisher.submit(_progress("a", 1), [], hold=True)  # a step's output, held back
        publisher.submit({}, [_ending("a")])  # the same request cancelled meanwhile
        publisher.flush()
        assert [(list(p), [e.work.request_id for e in es]) for p, es in publish.batches] == [
            (["a"], []),
            ([], ["a"]),
        ]
        publisher.submit(_progress("b", 1), [], hold=True)
        publisher.release()
        publisher.submit(_progress("c", 1), [], hold=True)
        publisher.stop()  # a batch still held goes out before the thread ends
        assert [list(p) for p, _ in publish.batches[2:]] == [["b"], ["c"]]
    finally:
        publisher.stop()
