"""A frontdoor told to stop (SIGTERM) drains: it stops admitting, lets what it is
streaming finish within EBB_FRONTDOOR_DRAIN_S, then exits.

uvicorn does the stopping: on SIGTERM it closes its listening socket (new connections are
refused there, and a load balancer sends them to another frontdoor), closes idle
keep-alive connections, waits up to its graceful-shutdown timeout for the responses in
flight, then cancels what is left. `Drain` tells the frontdoor that it is draining, so
that a stream cancelled at the end of the grace is not taken for a client that left: its
request keeps running, and its client resumes it on another frontdoor (routes_resume).
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)


class Drain:
    def __init__(self) -> None:
        self.draining = False

    def watch_signals(self) -> None:
        """Be told of SIGTERM/SIGINT, then pass them on to the handler already installed
        (uvicorn's, which starts the graceful shutdown). Call on the main thread, once the
        server has installed its handlers (in the app's startup); elsewhere (an app under
        a test client's thread) there is nothing to be told of."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)
            if not callable(previous):
                continue  # no server handler to chain to (run outside uvicorn's serve)
            signal.signal(sig, self._chained(previous))

    def _chained(self, previous: Any) -> Any:
        def handler(signum: int, frame: FrameType | None) -> None:
            if not self.draining:
                log.info("frontdoor: draining (signal %d): no new requests", signum)
            self.draining = True
            previous(signum, frame)

        return handler


def run_workers(config: Any) -> None:
    """uvicorn's supervisor over `config.workers` frontdoor processes on one socket
    (what `uvicorn.run` does for workers > 1), except that on SIGTERM the supervisor
    closes its own copy of the listening socket as it tells the workers to drain: the
    port then refuses new connections at once, rather than queueing them in the kernel's
    backlog, unanswered, until the last worker has drained (`config`: a uvicorn.Config).
    """
    from uvicorn.supervisors import Multiprocess

    class Draining(Multiprocess):
        def terminate_all(self) -> None:
            for sock in self.sockets:
                sock.close()
            super().terminate_all()

    Draining(config, sockets=[config.bind_socket()]).run()
