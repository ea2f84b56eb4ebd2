"""One source's weights prepared in a process of its own: `ebb prepare SOURCE`.

The controller's preparer (`ebb.coldstart.preparer`) starts this process and follows it;
it is short-lived so that what preparing costs in memory (torch and transformers for a
GGUF conversion, boto3 for S3) leaves with it, and no long-lived process pays for it.

Its standard output is the contract: JSON lines, each one `PrepareMessage`, ending in
exactly one `PrepareDone` or `PrepareFailed` (a process that exits without either has
crashed; its log says why). Its exit status is 0 after `PrepareDone`, 1 otherwise.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import IO

import msgspec

from ebb.errors import EbbError, WeightsError

# Progress lines at most this often: enough for a live bar, few enough to be free.
PROGRESS_INTERVAL_S = 0.25


class PrepareProgress(msgspec.Struct, tag="progress"):
    phase: str  # download, convert, hash, verify, publish (see `ensure`)
    fraction: float


class PrepareDone(msgspec.Struct, tag="done"):
    path: str  # the cached model directory, Hugging Face layout
    max_model_len: int
    size_bytes: int


class PrepareFailed(msgspec.Struct, tag="failed"):
    message: str  # says what to change, as the weights errors do
    code: str  # the weights error's code, e.g. weights_not_found


PrepareMessage = PrepareProgress | PrepareDone | PrepareFailed

_decoder = msgspec.json.Decoder(PrepareMessage)
_encoder = msgspec.json.Encoder()


def decode_message(line: bytes) -> PrepareMessage:
    """One line of a preparation's output; raises msgspec.DecodeError when it is not one."""
    return _decoder.decode(line)


def failure_error(failed: PrepareFailed) -> WeightsError:
    """The weights error a failed preparation stands for, with its code."""
    return WeightsError(failed.message, code=failed.code)


class _ThrottledProgress:
    def __init__(self, out: IO[bytes]):
        self._out = out
        self._last_s = 0.0

    def __call__(self, phase: str, fraction: float) -> None:
        now_s = time.monotonic()
        if fraction < 1.0 and now_s - self._last_s < PROGRESS_INTERVAL_S:
            return
        self._last_s = now_s
        _write(self._out, PrepareProgress(phase, round(fraction, 4)))


def _write(out: IO[bytes], message: PrepareMessage) -> None:
    out.write(_encoder.encode(message) + b"\n")
    out.flush()


def _protocol_stdout() -> IO[bytes]:
    """Standard output for this module's lines alone: whatever else writes to file
    descriptor 1 from now on (a library's print, a progress bar) goes to stderr, so no
    stray text can run into a protocol line."""
    protocol = os.fdopen(os.dup(1), "wb")
    sys.stdout.flush()
    os.dup2(2, 1)
    return protocol


def run_preparation(source: str, cache_dir: Path, out: IO[bytes] | None = None) -> int:
    """Prepare `source` in `cache_dir` (options from this process's settings) and report
    on `out` (standard output by default); returns the exit status."""
    from ebb.config import Settings
    from ebb.weights_cache import CacheOptions, ensure

    out = out or _protocol_stdout()
    options = CacheOptions.from_settings(Settings())
    try:
        model = ensure(source, cache_dir, _ThrottledProgress(out), options=options)
    except EbbError as e:
        _write(out, PrepareFailed(e.message, e.code))
        return 1
    except Exception as e:  # a bug or an unexpected library error: still an answer
        message = f"Preparing the weights of {source} failed: {e}"
        _write(out, PrepareFailed(message, WeightsError.code))
        raise
    _write(out, PrepareDone(str(model.path), model.max_model_len, model.size_bytes))
    return 0
