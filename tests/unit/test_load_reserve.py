"""The memory a CPU stem writes before it joins the pool (ebb/runners/load_reserve.py)."""

from __future__ import annotations

import threading

from ebb.process_memory import memory_of
from ebb.runners.load_reserve import LoadReserve, cgroup_headroom, reserve_for_stem

MIB = 1 << 20


def rss_bytes() -> int:
    measured = memory_of()
    assert measured is not None
    return measured[0]


def test_a_reserve_is_written_in_full_held_and_unmapped_on_release():
    before = rss_bytes()
    reserve = LoadReserve(64 * MIB)
    assert reserve.wait_written(threading.Event())
    assert reserve.written_bytes == 64 * MIB
    held = rss_bytes()
    assert held - before >= 60 * MIB  # every page written, so resident
    reserve.release()
    assert held - rss_bytes() >= 60 * MIB
    reserve.release()  # a second release is a no-op


def test_a_stem_told_to_stop_stops_the_writing_and_still_unmaps_what_it_wrote():
    stop = threading.Event()
    stop.set()
    before = rss_bytes()
    reserve = LoadReserve(1024 * MIB)
    assert not reserve.wait_written(stop)
    reserve.release()
    assert reserve.written_bytes < reserve.size_bytes
    assert rss_bytes() - before < 64 * MIB


def test_no_reserve_with_gpus_when_turned_off_or_larger_than_the_host_can_spare():
    assert reserve_for_stem(1.5, gpus=1) is None
    assert reserve_for_stem(0, gpus=0) is None
    assert reserve_for_stem(1024 * 1024, gpus=0) is None  # a PiB: over a quarter of any host


def test_a_cpu_stem_gets_a_reserve_of_the_size_asked_for():
    reserve = reserve_for_stem(1 / 64, gpus=0)
    assert reserve is not None
    try:
        assert reserve.size_bytes == 16 * MIB
        assert reserve.wait_written(threading.Event())
    finally:
        reserve.release()


def test_a_pods_memory_limit_bounds_what_is_available(tmp_path):
    (tmp_path / "memory.max").write_text("4294967296\n")  # a 4 GiB limit, 3 GiB used
    (tmp_path / "memory.current").write_text(str(3 << 30))
    assert cgroup_headroom("memory.max", "memory.current", f"{tmp_path}/") == 1 << 30
    (tmp_path / "memory.max").write_text("max\n")  # no limit: the host's figure holds
    assert cgroup_headroom("memory.max", "memory.current", f"{tmp_path}/") is None
    assert cgroup_headroom("absent.max", "absent.current", f"{tmp_path}/") is None
