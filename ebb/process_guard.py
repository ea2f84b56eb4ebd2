"""Child processes of `ebb up` exit when their parent is gone, so none outlives it."""

from __future__ import annotations

import os
import signal
import threading


def exit_when_orphaned(poll_s: float = 1.0) -> None:
    """Send ourselves SIGTERM (a clean shutdown) once our parent process has died."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="orphan-guard", daemon=True).start()
