"""Find and kill the processes of a running `ebb up` (by role), to test restarts."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil

from support import wait_until

ROLES = ("frontdoor", "coldstart", "webhooks", "runner")


def processes(home: Path, role: str) -> list[psutil.Process]:
    """Live processes of `role` started by the platform whose EBB_HOME is `home`."""
    homes = {str(home), str(home.resolve())}
    found = []
    for proc in psutil.process_iter(["cmdline", "environ", "status"]):
        info = proc.info
        cmdline = info.get("cmdline") or []
        if info["status"] == psutil.STATUS_ZOMBIE or not cmdline:
            continue
        if (info.get("environ") or {}).get("EBB_HOME") not in homes:
            continue
        if cmdline[1:4] == ["-m", "ebb", role]:
            found.append(proc)
    return found


def pid_of(home: Path, role: str) -> int:
    procs = wait_until(lambda: processes(home, role), 30, f"a {role} process")
    return procs[0].pid


def crash(home: Path, role: str) -> int:
    """SIGKILL the process of `role` (no chance to clean up); returns its pid."""
    pid = pid_of(home, role)
    os.kill(pid, signal.SIGKILL)
    return pid


def wait_replaced(home: Path, role: str, old_pid: int, timeout_s: float = 60) -> int:
    """Wait until `ebb up` restarted `role` as a new process; returns the new pid."""
    procs = wait_until(
        lambda: [p for p in processes(home, role) if p.pid != old_pid],
        timeout_s,
        f"ebb up to restart the {role}",
    )
    return procs[0].pid
