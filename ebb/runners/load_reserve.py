"""Memory a CPU stem writes before it joins the pool, unmapped the moment its load begins.

On a virtual machine whose host takes free guest memory back (free page reporting or a
balloon, as on Firecracker microVMs), the first write to a page the guest has not used
lately costs a fault in the host as well as in the guest. Here that made fresh memory cost
~2 s per GiB to write, against ~0.4 s for memory freed a moment before. A CPU engine load
writes about 8 bytes per parameter (float32 weights, then oneDNN's packed copies): ~1 GiB
for the default model. So how long a pre-warmed start took depended on which pages the
kernel had on hand, and up to half of it went to those faults (engine build 0.9-1.6 s for
the same load, first token 1.1-1.8 s after the request).

A stem on a host without GPUs writes EBB_STEM_LOAD_RESERVE_GIB of anonymous memory, then
offers itself to the pool, and unmaps the memory just before it loads its model. The kernel
hands out recently freed pages first, so the load's allocations get pages the host already
backs. The price is that memory, held by each waiting stem (and shown in its RSS), and the
few seconds of one core it takes to write, before the stem (and `ebb up`) is ready; a
request meanwhile gets a forked runner, as when the pool is empty.

The writing runs on a thread of its own at the lowest CPU priority, a chunk at a time with
the GIL released, so a runner serving on the same cores (beside a refilled stem) goes first.

Elsewhere (bare metal, a VM whose host keeps its memory backed) fresh pages cost no host
fault, and the reserve buys nothing for what it costs. So by default ("auto") a stem writes
one only where the guest reports its free pages to its host (`guest_reports_free_pages`);
a number turns it on at that size anywhere, 0 off.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
import time
from pathlib import Path
from typing import Literal

from ebb.process_memory import kib_fields

log = logging.getLogger(__name__)

# One write: ~16 ms of host faults on fresh memory here, about the longest a stem told to
# stop waits for the writer.
_CHUNK_BYTES = 8 << 20
# How often a stem waiting for its reserve looks at its stop event.
_STOP_POLL_S = 0.1
# Never more than this share of the memory the host has available when the stem starts.
_MAX_SHARE_OF_AVAILABLE = 0.25
# The size "auto" picks where the guest reports free pages: about what the default model's
# CPU load writes (see above).
AUTO_RESERVE_GIB = 1.5
# VIRTIO_BALLOON_F_REPORTING (virtio spec, balloon device feature bits): the driver hands
# free pages to the host, which takes their backing away (Firecracker, QEMU's
# free-page-reporting=on). Free page hinting (bit 3) is left out: a host reads those hints
# only while it migrates the guest.
_BALLOON_F_REPORTING = 5

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


class LoadReserve:
    """`size_bytes` of private anonymous memory, written by a background thread."""

    def __init__(self, size_bytes: int):
        address = _libc.mmap(
            None,
            size_bytes,
            mmap.PROT_READ | mmap.PROT_WRITE,
            mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
            -1,
            0,
        )
        if address in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {size_bytes} bytes failed")
        self.size_bytes = size_bytes
        self.written_bytes = 0
        self._address: int | None = address
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._writing_s = 0.0
        self._writer = threading.Thread(target=self._write, name="load-reserve", daemon=True)
        self._writer.start()

    def _write(self) -> None:
        # Below every other thread and process on the host: a refilled stem must not slow
        # the runner serving beside it.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        assert self._address is not None
        offset = 0
        while offset < self.size_bytes and not self._stop.is_set():
            length = min(_CHUNK_BYTES, self.size_bytes - offset)
            # ctypes releases the GIL for the call: the stem's other threads run meanwhile.
            ctypes.memset(self._address + offset, 0, length)
            offset += length
            self.written_bytes = offset
        self._writing_s = time.monotonic() - self._started
        if offset == self.size_bytes:
            log.info(
                "runner: load reserve written: %.2f GiB in %.1f s",
                self.size_bytes / (1 << 30),
                self._writing_s,
            )

    def wait_written(self, stop: threading.Event) -> bool:
        """Until all of it is written (True) or `stop` is set (False: the writer stops)."""
        while self._writer.is_alive():
            if stop.wait(_STOP_POLL_S):
                self._stop.set()
                return False
        return self.written_bytes == self.size_bytes

    def release(self) -> None:
        """Stop writing and unmap it all (idempotent): its pages go back to the kernel,
        first in line for the allocations that follow."""
        if self._address is None:
            return
        self._stop.set()
        self._writer.join()
        started = time.monotonic()
        _libc.munmap(self._address, self.size_bytes)
        self._address = None
        complete = self.written_bytes == self.size_bytes
        log.info(
            "runner: load reserve released: %.2f of %.2f GiB written (%s), unmapped in %.0f ms",
            self.written_bytes / (1 << 30),
            self.size_bytes / (1 << 30),
            f"in {self._writing_s:.1f} s" if complete else "stopped early",
            (time.monotonic() - started) * 1000,
        )


def guest_reports_free_pages(sys_root: Path = Path("/sys")) -> bool:
    """Whether this machine is a guest that reports its free pages to its host: a virtio
    balloon bound to its driver with free page reporting negotiated. Its `features` file
    holds one character per feature bit, bit 0 first, "1" where negotiated."""
    driver = sys_root / "bus/virtio/drivers/virtio_balloon"
    try:
        devices = [d for d in driver.iterdir() if d.name.startswith("virtio")]
    except OSError:  # no virtio balloon driver: bare metal, or another hypervisor's
        return False
    for device in devices:
        try:
            features = (device / "features").read_text().strip()
        except OSError:
            continue
        if features[_BALLOON_F_REPORTING : _BALLOON_F_REPORTING + 1] == "1":
            return True
    return False


def resolved_size_gib(setting: float | Literal["auto"], sys_root: Path = Path("/sys")) -> float:
    """EBB_STEM_LOAD_RESERVE_GIB as a size: a number as given (0: none); "auto":
    AUTO_RESERVE_GIB where the guest reports free pages to its host, else 0."""
    if setting != "auto":
        return setting
    return AUTO_RESERVE_GIB if guest_reports_free_pages(sys_root) else 0.0


def reserve_for_stem(
    setting: float | Literal["auto"], *, gpus: int, sys_root: Path = Path("/sys")
) -> LoadReserve | None:
    """The reserve a stem writes before it joins the pool; None with GPUs (the weights go
    to device memory), with a size of 0 ("auto" on a machine that does not report free
    pages to its host), or when it would take over a quarter of the memory available (to
    the host, or to the stem's cgroup)."""
    if gpus > 0:
        return None
    size_gib = resolved_size_gib(setting, sys_root)
    if size_gib <= 0:
        if setting == "auto":
            log.info("runner: no load reserve: this machine does not report free pages")
        return None
    size_bytes = int(size_gib * (1 << 30)) // mmap.PAGESIZE * mmap.PAGESIZE
    available = _available_bytes()
    if available is not None and size_bytes > available * _MAX_SHARE_OF_AVAILABLE:
        log.info(
            "runner: no load reserve: %.2f GiB is over a quarter of the %.2f GiB available",
            size_bytes / (1 << 30),
            available / (1 << 30),
        )
        return None
    return LoadReserve(size_bytes)


def _available_bytes() -> int | None:
    """What this process could still take: the host's available memory, or its cgroup's
    headroom where that is smaller (a pod's memory limit)."""
    figures = [
        _meminfo_available(),
        cgroup_headroom("memory.max", "memory.current"),  # cgroup v2
        cgroup_headroom("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ]
    known = [f for f in figures if f is not None]
    return min(known) if known else None


def _meminfo_available() -> int | None:
    try:
        return kib_fields(Path("/proc/meminfo").read_text()).get("MemAvailable")
    except OSError:
        return None


def cgroup_headroom(limit_file: str, usage_file: str, root: str = "/sys/fs/cgroup/") -> int | None:
    """A cgroup's memory limit less what it uses, in bytes; None without a limit."""
    try:
        with open(root + limit_file) as limit, open(root + usage_file) as usage:
            limit_text, usage_bytes = limit.read().strip(), int(usage.read())
    except (OSError, ValueError):
        return None
    if not limit_text.isdigit() or int(limit_text) >= 1 << 60:  # "max", or v1's no limit
        return None
    return max(0, int(limit_text) - usage_bytes)
