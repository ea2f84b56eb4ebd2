"""This process's memory (and that of local processes it started), reported into Redis
every few seconds for `ebb status` (`ebb.queue.process_memory` holds the records).

RSS counts every resident page of a process; PSS divides pages shared between processes
(a fork server and the runners forked from it, say) among them, so PSS adds up across
processes where RSS overcounts. Both come from /proc (Linux); elsewhere nothing is
reported.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ebb.queue.connection import sync_client
from ebb.queue.process_memory import ProcessMemory, report_process_memory

log = logging.getLogger(__name__)

REPORT_INTERVAL_S = 5.0


def memory_of(pid: int | str = "self") -> tuple[int, int | None] | None:
    """(rss_bytes, pss_bytes) of a process; None when it is gone or /proc is not there."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except PermissionError:
        text = ""
    except OSError:
        return None
    fields = kib_fields(text)
    if "Rss" in fields:
        return fields["Rss"], fields.get("Pss")
    try:  # no smaps_rollup (old kernel, or not ours to read): RSS alone
        status = kib_fields(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return None
    return (status["VmRSS"], None) if "VmRSS" in status else None


def kib_fields(text: str) -> dict[str, int]:
    """'Name:   123 kB' lines as {name: bytes}."""
    fields = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            fields[name.strip()] = int(parts[0]) * 1024
    return fields


class MemoryReporter(threading.Thread):
    """Reports this process's memory as `role`, and that of the local processes
    `others()` names ((role, pid) pairs, e.g. the fork server a controller started),
    every REPORT_INTERVAL_S on a blocking client of its own, until the process exits."""

    def __init__(
        self,
        redis_url: str,
        role: str,
        *,
        runner_id: str = "",
        others: Callable[[], list[tuple[str, int]]] = list,
        interval_s: float = REPORT_INTERVAL_S,
    ):
        super().__init__(name="memory-reporter", daemon=True)
        self._client = sync_client(redis_url, outage_s=0)
        self._role = role
        self._runner_id = runner_id
        self._others = others
        self._interval_s = interval_s
        self._host = socket.gethostname()

    def records(self) -> list[ProcessMemory]:
        now_ms = int(time.time() * 1000)
        wanted = [(self._role, os.getpid(), self._runner_id)]
        wanted += [(role, pid, "") for role, pid in self._others()]
        records = []
        for role, pid, runner_id in wanted:
            memory = memory_of("self" if pid == os.getpid() else pid)
            if memory is not None:
                rss, pss = memory
                records.append(
                    ProcessMemory(role, self._host, pid, rss, pss, now_ms, runner_id=runner_id)
                )
        return records

    def run(self) -> None:
        while True:
            try:
                report_process_memory(self._client, self.records())
            except Exception as e:  # Redis away for a while: the next report catches up
                log.debug("memory report failed: %s", e)
            time.sleep(self._interval_s)


def start_memory_reporter(redis_url: str, role: str, **kwargs) -> MemoryReporter | None:
    """Start reporting (no-op without /proc, or without Redis configured)."""
    if not redis_url or memory_of() is None:
        return None
    reporter = MemoryReporter(redis_url, role, **kwargs)
    reporter.start()
    return reporter
