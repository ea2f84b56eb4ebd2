"""A runner told to stop (SIGTERM) while it loads its engine exits at once, cleanly.

Nothing was admitted to it yet, so nothing is lost: it ends EXITED (not a failure the
controller counts), the engine's child processes end with it, and a load that finishes
after the stop never serves. The fake engine's `load_s` stands in for a slow load.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import psutil
import pytest
from support import REPO_ROOT, Platform, deploy, deployment, temp_home, wait_until

from ebb.queue import keys
from ebb.queue.runner_side import RunnerQueue

pytestmark = pytest.mark.integration

# Far longer than any wait here: a runner that exits did not finish this load.
LOAD_S = 60
# How long a stopped runner may take to exit: a heartbeat and a Redis write or two.
EXIT_WAIT_S = 20


def _loading_runner(admin: httpx.Client, name: str) -> dict:
    return wait_until(
        lambda: next(
            (r for r in deployment(admin, name)["runners"] if r["state"] == "loading"), None
        ),
        60,
        f"a runner of {name} loading",
    )


def _runner(admin: httpx.Client, name: str, runner_id: str) -> dict:
    return next(r for r in deployment(admin, name)["runners"] if r["id"] == runner_id)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_runner_terminated_while_loading_exits_cleanly_with_its_children(platform, admin):
    name = "stopload-term"
    deploy(admin, name, source=f"fake://m?load_s={LOAD_S}&load_child=1", min_replicas=1)
    runner = _loading_runner(admin, name)
    children = wait_until(
        lambda: psutil.Process(runner["pid"]).children(),
        30,
        "the engine's child process",
    )
    os.kill(runner["pid"], signal.SIGTERM)
    stopped = wait_until(
        lambda: (r := _runner(admin, name, runner["id"]))["state"] != "loading" and r,
        EXIT_WAIT_S,
        "the loading runner to exit on SIGTERM",
    )
    assert stopped["state"] == "exited", stopped
    assert stopped["error"] is None and not stopped["ready_ms"], stopped
    wait_until(lambda: _gone(runner["pid"]), EXIT_WAIT_S, "the runner's process to end")
    assert all(_gone(c.pid) for c in children), "the engine's child outlived its runner"
    # The controller saw the exit (it starts another for min_replicas) and took it as one:
    # no failure recorded, no backoff shown on the deployment.
    wait_until(
        lambda: any(r["id"] != runner["id"] for r in deployment(admin, name)["runners"]),
        60,
        "the controller to start another runner",
    )
    view = deployment(admin, name)
    assert _runner(admin, name, runner["id"])["state"] == "exited"
    assert view["error"] is None, view


def test_a_load_that_finishes_after_the_stop_never_serves(platform, admin):
    name = "stopload-late"
    # The load swallows the stop and runs to its end: the runner must exit right after.
    deploy(admin, name, source="fake://m?load_s=8&load_shielded=1", min_replicas=1)
    runner = _loading_runner(admin, name)
    os.kill(runner["pid"], signal.SIGTERM)
    stopped = wait_until(
        lambda: (r := _runner(admin, name, runner["id"]))["state"] != "loading" and r,
        EXIT_WAIT_S + 8,
        "the runner to leave LOADING",
    )
    assert stopped["state"] == "exited", stopped
    assert not stopped["ready_ms"], "it went READY after it was told to stop"
    log = stopped["log_tail"]
    assert any(line.endswith("loading -> exited") for line in log), log


@pytest.fixture
def own_platform(redis_url):
    """A platform on a Redis of the test's own, which outlives `ebb up`'s stop."""
    p = Platform(home=temp_home("ebb-stopload-"), redis_url=redis_url).start()
    yield p
    p.stop(timeout_s=120)


def test_stopping_the_platform_while_a_runner_loads_is_prompt(own_platform, redis_url):
    import redis

    name = "stopload-up"
    with own_platform.admin() as admin:
        deploy(admin, name, source=f"fake://m?load_s={LOAD_S}", min_replicas=1)
        runner = _loading_runner(admin, name)
    assert own_platform.stop() == 0
    # The controller SIGKILLs what has not exited 30 s after its stop (long before this
    # load could end): a runner that waited for its load would be left `loading`.
    client = redis.Redis.from_url(redis_url)
    record = RunnerQueue(client, runner["id"], lease_ttl_s=30, result_ttl_s=60).record()
    assert record is not None and record.state.value == "exited", record
    assert not record.error and record.exited_ms, record
    assert _gone(runner["pid"])


def test_a_stem_terminated_while_importing_the_engine_exits_before_the_import_ends(redis_url):
    import redis

    home = temp_home("ebb-stopload-stem-")
    env = dict(os.environ, EBB_HOME=str(home), EBB_REDIS_URL=redis_url, PYTHONUNBUFFERED="1")
    client = redis.Redis.from_url(redis_url)
    with open(home / "runner.log", "wb") as log:
        # A stem (no deployment) imports vLLM first: seconds of work.
        stem = subprocess.Popen(
            [sys.executable, "-m", "ebb", "runner", "--runner-id", "r-stem", "--tier", "prewarmed"],
            env=env,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        # Its pid is written once its stop is handled, just before the import.
        wait_until(lambda: client.hget(keys.runner("r-stem"), "pid"), 60, "the stem to start")
        stem.send_signal(signal.SIGTERM)
        assert stem.wait(timeout=EXIT_WAIT_S) == 0
    finally:
        stem.kill()
    output = (home / "runner.log").read_text()
    assert "preload (vllm imports) took" not in output, "the import ran to its end"
    assert "stopped while importing the engine" in output, output
    record = client.hgetall(keys.runner("r-stem"))
    assert record[b"state"] == b"exited" and not record.get(b"error"), record
