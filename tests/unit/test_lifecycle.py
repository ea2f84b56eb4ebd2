"""The runner lifecycle state machine."""

from __future__ import annotations

import pytest

from ebb.queue.schema import RunnerState as S
from ebb.runners.lifecycle import InvalidTransition, Lifecycle, can_transition


class RecordingQueue:
    runner_id = "r-test"

    def __init__(self) -> None:
        self.fields: dict = {}
        self.log: list[str] = []
        self.left_pool = False

    def set_fields(self, **fields) -> None:
        self.fields.update(fields)

    def append_log(self, line: str) -> None:
        self.log.append(line)

    def leave_pool(self) -> None:
        self.left_pool = True


def test_a_stem_goes_through_every_state_to_exit():
    queue = RecordingQueue()
    life = Lifecycle(queue)
    for state in (S.PREWARMED, S.LOADING, S.READY, S.DRAINING, S.EXITED):
        life.to(state)
        assert queue.fields["state"] is state
    assert queue.fields["ready_ms"] > 0 and queue.fields["exited_ms"] > 0
    assert queue.left_pool
    assert [line.split(" ", 1)[1] for line in queue.log] == [
        "starting -> prewarmed",
        "prewarmed -> loading",
        "loading -> ready",
        "ready -> draining",
        "draining -> exited",
    ]


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (S.READY, S.LOADING),
        (S.EXITED, S.READY),
        (S.FAILED, S.READY),
        (S.DRAINING, S.READY),
        (S.STARTING, S.READY),
        (S.SLEEPING, S.PREWARMED),
    ],
)
def test_impossible_transitions_are_refused(current, new):
    assert not can_transition(current, new)
    with pytest.raises(InvalidTransition):
        Lifecycle(RecordingQueue(), current).to(new)


def test_sleeping_runners_wake_or_leave():
    assert can_transition(S.READY, S.SLEEPING)
    assert can_transition(S.SLEEPING, S.READY)
    assert can_transition(S.SLEEPING, S.EXITED)


def test_fail_records_the_error_once_and_is_idempotent():
    queue = RecordingQueue()
    life = Lifecycle(queue, S.LOADING)
    life.fail("out of memory")
    life.fail("again")
    assert queue.fields["state"] is S.FAILED and queue.fields["error"] == "out of memory"
    assert len(queue.log) == 1 and "out of memory" in queue.log[0]
