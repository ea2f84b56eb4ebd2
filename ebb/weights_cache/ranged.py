"""Parallel, resumable download of a set of files as byte ranges.

Each file is written in place at its final size: ranges (parts) are fetched by a pool of
threads and written with `pwrite` at their offsets. A part counts as done only once its
bytes are on disk (fdatasync) and its number is appended to the file's journal
(`.<name>.parts`), so a download that was killed resumes where it stopped, part by part.
The journal's first line names the object version and part size it belongs to: a changed
object, or another part size, starts the file over rather than mixing bytes.

Which transport fetches a range (S3, HTTP) is the caller's `read_range`.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ebb.errors import WeightsTransientError
from ebb.weights_cache.options import CacheOptions
from ebb.weights_cache.retry import with_retries

logger = logging.getLogger(__name__)

_JOURNAL_FORMAT = "ebb-parts-v1"


@dataclass(frozen=True)
class RemoteFile:
    name: str  # the file's name in the destination directory
    size_bytes: int
    version: str  # changes whenever the remote bytes do (an ETag)
    source: str  # for messages: where it comes from


# (file, first byte, last byte inclusive) -> the bytes of that range, in chunks.
ReadRange = Callable[[RemoteFile, int, int], Iterable[bytes]]


def journal_path(dest: Path, name: str) -> Path:
    return dest / f".{name}.parts"


def forget(dest: Path, name: str) -> None:
    """Drop a file and its journal: the next download starts it from scratch."""
    for path in (dest / name, journal_path(dest, name)):
        path.unlink(missing_ok=True)


@dataclass
class _FileState:
    remote: RemoteFile
    fd: int
    journal: TextIO  # the open journal file
    todo: list[int]
    lock: threading.Lock = field(default_factory=threading.Lock)
    remaining: int = 0

    def close(self) -> None:
        self.journal.close()
        os.close(self.fd)


class RangedDownload:
    """One download of `files` into `dest`. Call `run()` once.

    `on_bytes(n)` reports progress (negative when a failed part's bytes are discounted);
    `on_complete(file)` runs in a worker thread as soon as a file has all its parts, so a
    caller can verify it while other files still download.
    """

    def __init__(
        self,
        files: list[RemoteFile],
        dest: Path,
        read_range: ReadRange,
        options: CacheOptions,
        on_bytes: Callable[[int], None],
        on_complete: Callable[[RemoteFile], None],
    ):
        self.files = files
        self.dest = dest
        self.read_range = read_range
        self.options = options
        self.on_bytes = on_bytes
        self.on_complete = on_complete
        self._stop = threading.Event()

    def run(self) -> None:
        states = [self._open(f) for f in self.files]
        try:
            with cf.ThreadPoolExecutor(
                max_workers=max(1, self.options.concurrency), thread_name_prefix="fetch"
            ) as pool:
                futures = [pool.submit(self._complete, s) for s in states if not s.todo]
                futures += [pool.submit(self._part, s, i) for s in states for i in s.todo]
                self._wait(futures)
        finally:
            for state in states:
                state.close()

    def _wait(self, futures: list[cf.Future[None]]) -> None:
        done, pending = cf.wait(futures, return_when=cf.FIRST_EXCEPTION)
        errors = [error for f in done if (error := f.exception()) is not None]
        if errors:
            self._stop.set()  # running parts notice between chunks; queued ones skip
            for future in pending:
                future.cancel()
            cf.wait(pending)
            raise errors[0]

    def _open(self, remote: RemoteFile) -> _FileState:
        path = self.dest / remote.name
        parts = max(1, -(-remote.size_bytes // self.options.part_bytes))
        header = f"{_JOURNAL_FORMAT} {remote.version} {remote.size_bytes} {self.options.part_bytes}"
        done = _read_journal(journal_path(self.dest, remote.name), header, path, remote.size_bytes)
        if done is None:
            forget(self.dest, remote.name)
            done = set()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.ftruncate(fd, remote.size_bytes)
        journal = open(journal_path(self.dest, remote.name), "a")  # noqa: SIM115 - closed by state
        if journal.tell() == 0:
            journal.write(header + "\n")
            journal.flush()
        resumed = sum(self._part_len(remote, i) for i in done if i < parts)
        if resumed:
            logger.info(
                "weights: resuming %s: %d of %d bytes", remote.source, resumed, remote.size_bytes
            )
            self.on_bytes(resumed)
        todo = [i for i in range(parts) if i not in done] if remote.size_bytes else []
        return _FileState(remote, fd, journal, todo, remaining=len(todo))

    def _part_len(self, remote: RemoteFile, index: int) -> int:
        start = index * self.options.part_bytes
        return max(0, min(self.options.part_bytes, remote.size_bytes - start))

    def _part(self, state: _FileState, index: int) -> None:
        if self._stop.is_set():
            return
        start = index * self.options.part_bytes
        end = start + self._part_len(state.remote, index) - 1
        with_retries(
            lambda: self._fetch_part(state, start, end),
            f"fetching bytes {start}-{end} of {state.remote.source}",
            self.options.attempts,
            self.options.backoff_s,
        )
        os.fdatasync(state.fd)
        with state.lock:
            state.journal.write(f"{index}\n")
            state.journal.flush()
            state.remaining -= 1
            last = state.remaining == 0
        if last:
            self._complete(state)

    def _fetch_part(self, state: _FileState, start: int, end: int) -> None:
        offset = start
        try:
            for chunk in self.read_range(state.remote, start, end):
                if self._stop.is_set():
                    raise _Stopped()
                os.pwrite(state.fd, chunk, offset)
                offset += len(chunk)
                self.on_bytes(len(chunk))
        except BaseException:
            self.on_bytes(start - offset)  # these bytes will be fetched again
            raise
        if offset != end + 1:
            raise WeightsTransientError(
                f"{state.remote.source}: range {start}-{end} ended after {offset - start} bytes"
            )

    def _complete(self, state: _FileState) -> None:
        if not self._stop.is_set():
            self.on_complete(state.remote)


class _Stopped(Exception):
    """Another part failed; this one gives up quietly (its error is not the story)."""


def _read_journal(journal: Path, header: str, path: Path, size_bytes: int) -> set[int] | None:
    """Done part numbers, or None when the journal is absent or belongs to other bytes."""
    try:
        lines = journal.read_text().split("\n")
    except FileNotFoundError:
        return None
    if not lines or lines[0] != header:
        return None
    try:
        if path.stat().st_size != size_bytes:
            return None
    except FileNotFoundError:
        return None
    # The last line may be cut short by a crash; it is then ignored (and refetched).
    return {int(line) for line in lines[1:-1] if line.isdigit()}
