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


def test_a_runner_follows_its_parent_only_when_launched_locally(monkeypatch):
    import ebb.runners.process as process

    parent = {"pid": 4242}
    monkeypatch.setattr(process.os, "getppid", lambda: parent["pid"])
    stops = {follow: threading.Event() for follow in (True, False)}
    queues = {follow: RecordingQueue() for follow in stops}
    beats = [Heartbeat(queues[f], interval_s=0.01, stop=stops[f], follow_parent=f) for f in stops]
    for heartbeat in beats:
        heartbeat.start()
    wait_until(lambda: all(q.beats for q in queues.values()), 5, "heartbeats")
    parent["pid"] = 1  # reparented: the launching process died
    stops[True].wait(timeout=5)
    beaten = len(queues[False].beats)
    wait_until(lambda: len(queues[False].beats) > beaten + 2, 5, "more heartbeats")
    for heartbeat in beats:
        heartbeat.done.set()
        heartbeat.join(timeout=5)
    assert stops[True].is_set(), "a local runner drains once its parent is gone"
    assert not stops[False].is_set(), "a cluster runner lives on its heartbeat alone"
