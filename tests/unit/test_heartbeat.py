"""The runner's heartbeat thread: beats with what the runner holds, and can be joined."""

from __future__ import annotations

import threading

from support import wait_until

from ebb.runners.process import Heartbeat


class RecordingQueue:
    def __init__(self) -> None:
        self.beats: list[list[str]] = []

    def heartbeat(self, held_ids: list[str]) -> None:
        self.beats.append(held_ids)


def test_heartbeat_reports_held_ids_and_joins_once_done():
    queue = RecordingQueue()
    heartbeat = Heartbeat(queue, interval_s=0.01, stop=threading.Event())
    heartbeat.held_ids = lambda: ["req-1"]
    heartbeat.start()
    wait_until(lambda: queue.beats, 5, "a heartbeat")
    heartbeat.done.set()
    # join() failed with TypeError while the thread kept the runner's stop event as `_stop`.
    heartbeat.join(timeout=5)
    assert not heartbeat.is_alive()
    assert queue.beats[0] == ["req-1"]
