"""How much of a model's weight files sits in the OS page cache (mincore(2) via ctypes)."""

from __future__ import annotations

import ctypes
import mmap
import os
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
