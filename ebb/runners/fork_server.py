"""The fork server: one process that has paid for the engine's imports and forks runners.

Importing torch and vLLM is most of a fresh runner's start (~7-8 s of ~9 s on 2 cores).
The fork server imports them once, then forks a runner per request from the controller;
the child inherits the imported modules (copy-on-write), so a runner that was not waiting
in the pre-warmed pool still starts in about the time a stem takes to load its model.

Protocol (JSON lines): the controller writes {"runner_id", "deployment", "tier",
"log_path", "launched_ms"} to stdin; the server writes {"event": "ready"} once, then
{"event": "spawned", "runner_id", "pid"} per fork and {"event": "exited", "runner_id",
"code"} when a runner exits (it is their parent, so it reaps them). It exits when stdin
closes: the controller is gone, and its runners notice their parent went and drain.

It stays single-threaded, never connects to Redis and never initialises CUDA (devices are
found through NVML, see `devices`), so that forking it is safe: every connection, thread
and CUDA context a runner uses is its own. Should CUDA be initialised once the engine is
imported, it says so ({"event": "disabled", "reason"}) and exits: the controller then
starts runners as fresh processes, with the reason in its log.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import sys
import traceback
from typing import Any, NoReturn

from ebb.config import Settings
from ebb.launching.handoff import LAUNCHED_AT_ENV
from ebb.runners.devices import fork_unsafe_reason

log = logging.getLogger(__name__)

# How often the loop reaps children when no request arrives.
_REAP_INTERVAL_S = 0.2


def serve_forks(settings: Settings) -> int:
    # The runner's process module too, before forking: every forked runner runs it.
    import ebb.runners.process  # noqa: F401
    from ebb.runners.loading import import_engine_libraries

    # Ctrl-C reaches the whole process group: the runners drain on it, and the server
    # stays to report their exits until the controller closes the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import_engine_libraries()
    unsafe = fork_unsafe_reason()
    if unsafe is not None:
        # Children of a process with a CUDA context fail on CUDA: no forked tier here.
        log.warning("fork-server: disabled: %s", unsafe)
        _send({"event": "disabled", "reason": unsafe})
        return 0
    children: dict[int, str] = {}
    _send({"event": "ready"})
    log.info("fork-server: ready (pid %d)", os.getpid())
    buffered = b""
    while True:
        readable, _, _ = select.select([sys.stdin.buffer], [], [], _REAP_INTERVAL_S)
        if readable:
            chunk = os.read(sys.stdin.fileno(), 65536)
            if not chunk:
                log.info("fork-server: the controller closed the pipe, exiting")
                return 0
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                if line.strip():
                    _fork(settings, json.loads(line), children)
        _reap(children)


def _fork(settings: Settings, request: dict[str, Any], children: dict[int, str]) -> None:
    # Nothing buffered may be written twice, once by each side of the fork.
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become_runner(settings, request)
    children[pid] = request["runner_id"]
    _send({"event": "spawned", "runner_id": request["runner_id"], "pid": pid})
    log.info("fork-server: forked %s as pid %d", request["runner_id"], pid)


def _reap(children: dict[int, str]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        runner_id = children.pop(pid, None)
        if runner_id is not None:
            _send({"event": "exited", "runner_id": runner_id, "code": _exit_code(status)})


def _exit_code(status: int) -> int:
    # As subprocess reports it: negative for a signal.
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _become_runner(settings: Settings, request: dict[str, Any]) -> NoReturn:
    code = 1
    try:
        log_fd = os.open(request["log_path"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.environ[LAUNCHED_AT_ENV] = str(request["launched_ms"])
        from ebb.launching.tiers import Tier
        from ebb.runners.process import run_runner

        tier = Tier(request["tier"])
        code = run_runner(settings, request["runner_id"], request["deployment"], tier)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _send(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()
