"""A CPU engine's serving thread on a core of its own (ebb/runners/core_pinning.py)."""

from __future__ import annotations

import fcntl
import os
import threading

import pytest

from ebb.runners.core_pinning import LOCK_FILE, own_core

CORES = sorted(os.sched_getaffinity(0))

pytestmark = pytest.mark.skipif(len(CORES) < 2, reason="pinning needs two cores: one stays free")


def test_a_lone_compute_thread_serves_on_the_last_core_then_gets_every_core_back(tmp_path):
    with own_core(tmp_path, compute_threads=1) as pin:
        assert pin is not None
        assert pin.core == CORES[-1]
        assert os.sched_getaffinity(0) == {CORES[-1]}
    assert os.sched_getaffinity(0) == set(CORES)


@pytest.mark.parametrize("threads", [0, 2])
def test_an_engine_on_a_gpu_or_on_several_threads_is_left_as_it_was(tmp_path, threads):
    with own_core(tmp_path, compute_threads=threads) as pin:
        assert pin is None
        assert os.sched_getaffinity(0) == set(CORES)


def test_a_second_runner_on_the_host_stays_unpinned_until_the_first_lets_go(tmp_path):
    # Another runner's engine holds the pin (flock: one open file each, as two processes).
    with open(tmp_path / LOCK_FILE, "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with own_core(tmp_path, compute_threads=1) as pin:
            assert pin is None
            assert os.sched_getaffinity(0) == set(CORES)
        fcntl.flock(other, fcntl.LOCK_UN)
    with own_core(tmp_path, compute_threads=1) as pin:
        assert pin is not None, "free again once the first let go"
    # ... and the pin is let go with the block.
    with open(tmp_path / LOCK_FILE, "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_threads_the_pinned_thread_starts_get_every_core_back(tmp_path):
    done = threading.Event()
    with own_core(tmp_path, compute_threads=1) as pin:
        assert pin is not None
        started = threading.Thread(target=done.wait, args=(10,))
        started.start()
        try:
            assert os.sched_getaffinity(started.native_id) == {pin.core}, "inherited"
            pin.free_new_threads()
            assert os.sched_getaffinity(started.native_id) == set(CORES)
            assert os.sched_getaffinity(0) == {pin.core}, "the serving thread keeps its core"
        finally:
            done.set()
            started.join()
