"""The hot tier: page-cache hints for a model's files.

After a runner exits, its weights stay in the OS page cache until memory pressure pushes
them out; the next start of the same model then reads memory, not disk. `warm()` asks the
kernel to read a model's files in the background (POSIX_FADV_WILLNEED), so a start whose
pages were pushed out overlaps that I/O with engine setup; `cold()` drops them (clean pages
only, no privileges needed), which is how bench/weights.py measures both cases. Both are
hints: they return at once and never fail a load.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

_HAS_FADVISE = hasattr(os, "posix_fadvise")


def warm(model_dir: Path) -> int:
    """Start reading the model's weight files into the page cache; returns bytes hinted."""
    return _advise(model_dir, "POSIX_FADV_WILLNEED")


def cold(model_dir: Path) -> int:
    """Drop the model's weight files from the page cache; returns bytes hinted."""
    return _advise(model_dir, "POSIX_FADV_DONTNEED")


def _advise(model_dir: Path, advice_name: str) -> int:
    if not _HAS_FADVISE:
        return 0
    advice = getattr(os, advice_name)
    total = 0
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, advice)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    logger.debug("weights: %s on %d bytes under %s", advice_name, total, model_dir)
    return total
