"""A runner's stop (ebb.runners.stopping): an exception in the main thread only while it
imports or loads, the event everywhere."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from ebb.runners.heartbeat import Heartbeat
from ebb.runners.stopping import RunnerStop, StopRequested, caused_by_stop


@pytest.fixture
def stopper():
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    stop = RunnerStop()
    stop.install()
    yield stop
    for sig, handler in kept.items():
        signal.signal(sig, handler)


def test_a_stop_interrupts_the_load_it_comes_during(stopper):
    with pytest.raises(StopRequested), stopper.interruptible():
        signal.raise_signal(signal.SIGTERM)
        time.sleep(30)  # a load the handler's exception ends
    assert stopper.event.is_set()


def test_a_stop_outside_a_load_only_sets_the_event(stopper):
    signal.raise_signal(signal.SIGTERM)
    assert stopper.event.is_set()
    # ...and a load that begins after it does not begin.
    ran = []
    with pytest.raises(StopRequested), stopper.interruptible():
        ran.append(True)
    assert not ran


def test_a_stop_from_another_thread_interrupts_the_main_threads_load(stopper):
    threading.Timer(0.2, stopper.request).start()
    with pytest.raises(StopRequested), stopper.interruptible():
        time.sleep(30)
    assert stopper.event.is_set()


class _Beats:
    def heartbeat(self, held_ids: list[str], *, engine_steps: int, engine_busy_ms: int) -> None:
        pass


def test_a_runner_whose_launcher_is_gone_gives_its_load_up(stopper, monkeypatch):
    import ebb.runners.heartbeat as heartbeat_module

    parent = {"pid": 4242}
    monkeypatch.setattr(heartbeat_module.os, "getppid", lambda: parent["pid"])
    heartbeat = Heartbeat(_Beats(), 0.01, stopper.event, on_orphaned=stopper.request)
    heartbeat.start()
    try:
        with pytest.raises(StopRequested), stopper.interruptible():
            parent["pid"] = 1  # reparented: the launching process died
            time.sleep(30)
    finally:
        heartbeat.done.set()
        heartbeat.join(timeout=5)


def test_the_exception_is_raised_once(stopper):
    with pytest.raises(StopRequested), stopper.interruptible():
        try:
            signal.raise_signal(signal.SIGTERM)
            time.sleep(30)
        finally:
            signal.raise_signal(signal.SIGINT)  # a second stop while unwinding: no raise


def test_an_error_raised_while_handling_a_stop_counts_as_the_stop():
    try:
        try:
            raise StopRequested("SIGTERM")
        except StopRequested:
            raise RuntimeError("engine init failed") from None
    except RuntimeError as e:
        assert caused_by_stop(e)  # `from None` hides it from tracebacks, not __context__
    assert not caused_by_stop(RuntimeError("a load that failed on its own"))


# In a process of its own: this one's children are the test session's.
_END_CHILDREN = """
import subprocess, sys, psutil
from ebb.runners.heartbeat import Heartbeat
from ebb.runners.stopping import end_children
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
end_children()  # ended and reaped: its pid is free
print(psutil.pid_exists(child.pid))
"""


def test_end_children_ends_what_the_load_started():
    done = subprocess.run(
        [sys.executable, "-c", _END_CHILDREN], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", "the child outlived end_children"
