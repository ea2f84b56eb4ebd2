"""A CPU engine's thread on a core of its own while it serves.

vLLM's own server binds its CPU worker's OpenMP threads to cores and leaves a core to
everything else (its API server and scheduler: `VLLM_CPU_OMP_THREADS_BIND=auto`). ebb's
in-process engine gets no such binding (see `engine_patches.OMP_THREADS`): left to the
kernel, the engine thread shares and swaps cores with the work each token wakes (the
runner's publisher thread, Redis, the frontdoor that streams the token). On a 2-core host
that made every decode step 2.7-3.6 % slower than with the engine thread pinned (c=1, one
platform with `EBB_ENGINE_CORE_PIN=0` and one without, alternated in one script), and put
ebb's time per output token 3-5 % behind vLLM's server's instead of within 1 %.

That is the one configuration measured, so by default ("auto", EBB_ENGINE_CORE_PIN) the
pin is taken only where the process may use exactly two cores (`pin_wanted`); with more,
whether a core of its own pays against the cores its OpenMP threads would otherwise have
is unmeasured. "1" pins wherever the rules below allow, "0" never (an operator who pins
processes).

Where it is wanted, the pin is taken only where it pays and harms no one:
- the engine computes on the serving thread alone (torch on one thread: ebb's default on
  a 2-core host; its OpenMP workers, with more threads, are not bound here);
- the process may use at least two cores, so one stays for the rest;
- no other runner of this platform on this host holds it (a lock file under EBB_HOME,
  which a host's runners share): two engines pinned to one core would share it while
  another core idles. A second runner stays unpinned, and the kernel runs it beside the
  pinned one.

The core is the last the process may use, the one the measurement above pinned.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

LOCK_FILE = "engine-core.lock"
# The cores of the host where pinning was measured to help (the module docstring).
MEASURED_CORES = 2


def pin_wanted(setting: bool | Literal["auto"], usable_cores: int | None = None) -> bool:
    """EBB_ENGINE_CORE_PIN as a decision: True or False as given; "auto": where the process
    may use exactly MEASURED_CORES cores (`usable_cores`, by default its affinity's)."""
    if setting != "auto":
        return setting
    if usable_cores is None:
        usable_cores = usable_core_count()
    return usable_cores == MEASURED_CORES


def usable_core_count() -> int:
    """The cores this process may run on: its affinity (a cpuset or taskset may allow
    fewer than the host has), or the host's count where the OS has no affinity."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class Pin:
    """The serving thread's core while `own_core` holds it."""

    def __init__(self, core: int, allowed: list[int]) -> None:
        self.core = core
        self._allowed = allowed
        self._threads_seen = threading.active_count()

    def free_new_threads(self) -> None:
        """Give threads started since the last call the process's cores back: a thread
        inherits the pin of the thread that starts it, and vLLM starts its grammar
        compilers (structured output) from the serving thread, on demand. They would
        otherwise compete with the engine for its core while the other cores idle. Cheap
        when no thread was started (a count compared)."""
        count = threading.active_count()
        if count == self._threads_seen:
            return
        self._threads_seen = count
        me = threading.get_native_id()
        for thread in threading.enumerate():
            if thread.native_id is not None and thread.native_id != me:
                with contextlib.suppress(OSError):  # it ended meanwhile
                    os.sched_setaffinity(thread.native_id, self._allowed)


@contextlib.contextmanager
def own_core(lock_dir: Path, compute_threads: int) -> Iterator[Pin | None]:
    """Pin the calling thread to a core of its own while the block runs, if it computes
    alone (`compute_threads` == 1) and the pin is free; yields the `Pin`, or None when it
    left the thread as it was."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else []
    if compute_threads != 1 or len(allowed) < 2:
        if compute_threads:  # a CPU engine: say why it was left to the kernel
            log.info(
                "runner: engine thread not pinned (it computes on %d threads, may use cores %s)",
                compute_threads,
                allowed,
            )
        yield None
        return
    try:
        lock_dir.mkdir(parents=True, exist_ok=True)
        lock = open(lock_dir / LOCK_FILE, "a")  # noqa: SIM115 - closed below, in order
    except OSError as e:
        log.info("runner: engine thread not pinned (no lock file: %s)", e)
        yield None
        return
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("runner: engine thread not pinned (another runner's engine holds a core)")
            yield None
            return
        pin = Pin(allowed[-1], allowed)
        os.sched_setaffinity(0, {pin.core})
        log.info("runner: engine thread pinned to core %d of %s", pin.core, allowed)
        try:
            yield pin
        finally:
            os.sched_setaffinity(0, allowed)
            fcntl.flock(lock, fcntl.LOCK_UN)
