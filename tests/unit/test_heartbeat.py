"""The runner's heartbeat thread: beats with what the runner holds and how its engine
progresses, watches the engine (see ebb.runners.stall), and can be joined."""

from __future__ import annotations

import threading

from support import wait_until

from ebb.queue.schema import RunnerState
from ebb.runners.heartbeat import Heartbeat
from ebb.runners.lifecycle import Lifecycle
from ebb.runners.stall import EngineProgress, Watchdog, die_of_stall


class RecordingQueue:
    def __init__(self) -> None:
        self.beats: list[list[str]] = []
        self.engine: list[tuple[int, int]] = []  # (steps, busy ms) of each beat

    def heartbeat(self, held_ids: list[str], *, engine_steps: int, engine_busy_ms: int) -> None:
        self.beats.append(held_ids)
        self.engine.append((engine_steps, engine_busy_ms))


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
    import ebb.runners.heartbeat as heartbeat_module

    parent = {"pid": 4242}
    monkeypatch.setattr(heartbeat_module.os, "getppid", lambda: parent["pid"])
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


def test_each_beat_carries_the_engine_progress_and_runs_the_watchdog_first():
    queue = RecordingQueue()
    now = {"s": 100.0}
    progress = EngineProgress(clock=lambda: now["s"])
    progress.stepped()
    progress.stepped()
    watched: list[int] = []
    heartbeat = Heartbeat(queue, interval_s=0.01, stop=threading.Event())
    heartbeat.progress = progress
    heartbeat.watchdog = lambda: watched.append(len(queue.beats))
    with progress.calling():
        now["s"] += 2.5  # a step that has run 2.5 s when the heartbeat beats
        heartbeat.start()
        wait_until(lambda: queue.beats, 5, "a heartbeat")
    heartbeat.done.set()
    heartbeat.join(timeout=5)
    assert queue.engine[0] == (2, 2500)
    assert watched[0] == 0, "the watchdog looks before the leases are renewed"


def test_the_watchdog_fires_once_when_one_engine_call_outlasts_the_limit():
    now = {"s": 0.0}
    progress = EngineProgress(clock=lambda: now["s"])
    fired: list[float] = []
    watchdog = Watchdog(progress, limit_s=10, give_up=fired.append)
    for _ in range(20):  # many short steps, idle time between them: never a stall
        with progress.calling():
            now["s"] += 1
            watchdog.check()
        progress.stepped()
        now["s"] += 30
        watchdog.check()
    assert fired == [] and progress.steps == 20
    with progress.calling():
        now["s"] += 9.9
        watchdog.check()
        assert fired == []
        now["s"] += 0.1
        watchdog.check()
        now["s"] += 5
        watchdog.check()
    assert fired == [10.0], "once, with how long the call had run"


class StallQueue:
    runner_id = "r-1"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.stalls: list[tuple[str, list[str], str]] = []
        self.fields: dict = {}
        self.log: list[str] = []

    def record_engine_stall(self, deployment: str, held: list[str], error: str) -> int:
        if self.fail:
            raise ConnectionError("Redis is away")
        self.stalls.append((deployment, held, error))
        return len(held)

    def append_log(self, line: str) -> None:
        self.log.append(line)


def test_a_stalled_runner_gives_its_requests_up_is_failed_and_ends():
    queue = StallQueue()
    lifecycle = Lifecycle(queue, RunnerState.READY)
    ended: list[bool] = []
    give_up = die_of_stall(
        queue, "m", lambda: ["a", "b"], lifecycle, 10, end=lambda: ended.append(True)
    )
    give_up(10.4)
    [(deployment, held, error)] = queue.stalls
    assert (deployment, held) == ("m", ["a", "b"])
    assert "no step for 10s" in error and "2 requests held" in error
    assert lifecycle.state is RunnerState.FAILED
    assert "engine stalled" in queue.log[-1]
    assert ended == [True]


def test_a_stalled_runner_ends_even_when_redis_is_away():
    queue = StallQueue(fail=True)
    lifecycle = Lifecycle(queue, RunnerState.READY)
    ended: list[bool] = []
    die_of_stall(queue, "m", lambda: ["a"], lifecycle, 10, end=lambda: ended.append(True))(11)
    assert ended == [True], "its leases then run out on their own"
