"""Runners forked from the fork server (fake engine): they serve, are followed through the
server (exits, SIGKILL), drain, and go with the platform."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from support import (
    Platform,
    deploy,
    deployment,
    sigkill_runner_mid_stream,
    temp_home,
    wait_until,
)

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform():
    p = Platform(
        home=temp_home("ebb-fork-"), redis_url=None, env_extra={"EBB_FORK_SERVER": "1"}
    ).start()
    # The server imports vLLM before it takes requests; until then runners are spawned.
    p.wait_for_fork_server()
    yield p
    server = fork_server_pid(p)
    assert p.stop() == 0
    assert not Path(f"/proc/{server}").exists(), "the fork server outlived the platform"


def fork_server_pid(platform: Platform) -> int:
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes()
        except (OSError, ValueError):
            continue
        if b"fork-server" in cmdline and f"EBB_HOME={platform.home}".encode() in environ:
            return int(entry.name)
    raise AssertionError("no fork server process for this platform")


def parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_a_runner_from_zero_is_forked_and_drains_when_idle(platform, admin):
    deploy(admin, "forked", "fake://m", idle_timeout_s=1)
    reply = platform.openai().chat.completions.create(
        model="forked", messages=MESSAGES, max_tokens=3
    )
    assert reply.usage.completion_tokens == 3
    [runner] = deployment(admin, "forked")["runners"]
    assert runner["tier"] == "forked"
    assert parent_pid(runner["pid"]) == fork_server_pid(platform)
    assert "forked" in deployment(admin, "forked")["cold_start_ms"]
    drained = wait_until(
        lambda: (r := deployment(admin, "forked")["runners"][0])["state"] == "exited" and r,
        30,
        "the forked runner to drain, and its exit to reach the controller",
    )
    assert drained["id"] == runner["id"]


def test_a_sigkilled_forked_runner_ends_its_stream_and_is_marked_failed(platform, admin):
    deploy(admin, "victim", "fake://m?step_ms=40", idle_timeout_s=60)
    # Two choices: no continuation can replay them (one would go on, see
    # test_continuation.py); the loss is the answer.
    runner, events = sigkill_runner_mid_stream(admin, "victim", n=2)
    assert runner["tier"] == "forked"
    error = json.loads(events[-2][len("data: ") :])["error"]
    assert error["code"] == "runner_lost"
    failed = wait_until(
        lambda: (r := deployment(admin, "victim")["runners"][0])["state"] == "failed" and r,
        30,
        "the fork server to report the killed runner",
    )
    assert "-9" in failed["error"]


def test_a_fork_server_that_dies_is_replaced(platform, admin):
    first = fork_server_pid(platform)
    os.kill(first, signal.SIGKILL)

    def fork_server() -> str:
        return admin.get("/v1/status").json()["fork_server"]

    wait_until(lambda: fork_server() != "ready", 30, "the controller to notice")
    platform.wait_for_fork_server()
    second = fork_server_pid(platform)
    assert second != first
    deploy(admin, "after", "fake://m", idle_timeout_s=60)
    reply = platform.openai().chat.completions.create(
        model="after", messages=MESSAGES, max_tokens=2
    )
    assert reply.usage.completion_tokens == 2
    [runner] = deployment(admin, "after")["runners"]
    assert runner["tier"] == "forked" and parent_pid(runner["pid"]) == second
