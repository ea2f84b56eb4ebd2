"""The OS page cache and a model's weight files: how much is resident (mincore(2) via
ctypes), and the hints that drop it (POSIX_FADV_DONTNEED, clean pages, no privileges) or
read it in ahead (POSIX_FADV_WILLNEED).

These back the hot-tier experiment in bench/weights.py. After a runner exits, its weights
stay in the page cache until memory pressure pushes them out; the question was whether a
WILLNEED hint at the next start, issued while vLLM builds its engine, wins back what a cold
page cache costs. Measured: no (x1.01 with it, against x1.14 for cold over warm), so runners
do not issue it; the page cache alone keeps a model warm between runners.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def resident_fraction(model_dir: Path) -> float:
    """Resident pages / all pages over the directory's *.safetensors files."""
    resident = total = 0
    for path in Path(model_dir).glob("*.safetensors"):
        size = path.stat().st_size
        if size == 0:
            continue
        pages = (size + _PAGE_BYTES - 1) // _PAGE_BYTES
        with open(path, "rb") as f:
            # A private mapping shares the file's cached pages; it is only needed writable
            # so ctypes can take its address. Mapping alone reads nothing in.
            mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
            try:
                vec = (ctypes.c_ubyte * pages)()
                address = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
                if _libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vec) != 0:
                    raise OSError(ctypes.get_errno(), "mincore failed")
                resident += sum(b & 1 for b in vec)
                total += pages
            finally:
                mapped.close()
    return resident / total if total else 0.0


def drop(model_dir: Path) -> int:
    """Drop the directory's weight files from the page cache; returns bytes advised."""
    return _advise(model_dir, os.POSIX_FADV_DONTNEED)


def read_ahead_in_background(model_dir: Path) -> None:
    """Ask the kernel to read the weight files in, from a daemon thread (the call itself may
    block while it queues the I/O)."""
    threading.Thread(target=_advise, args=(model_dir, os.POSIX_FADV_WILLNEED), daemon=True).start()


def _advise(model_dir: Path, advice: int) -> int:
    total = 0
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, advice)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return total
