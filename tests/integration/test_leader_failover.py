"""Two controllers on one Redis, the fake engine under load: only the leader launches; when
it is SIGKILLed the standby takes the lease and serves the queue; no request is lost and
no runner is launched twice."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import openai
import pytest
import redis
from support import REPO_ROOT, Platform, deploy, deployment, temp_home, wait_until
from support.platform_processes import processes

pytestmark = pytest.mark.integration

LEASE_S = 2.0
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
LAUNCH_RE = re.compile(r"coldstart: (?:spawned|forked) runner (r-[0-9a-f]+)")


@pytest.fixture
def two_controllers(redis_url):
    env = {"EBB_CONTROLLER_LEASE_S": str(LEASE_S), "EBB_ADMISSION_TIMEOUT_S": "20"}
    platform = Platform(home=temp_home("ebb-leader-"), redis_url=redis_url, env_extra=env)
    platform.start()
    standby_log = open(platform.home / "standby.log", "wb")  # noqa: SIM115 - closed below
    standby = subprocess.Popen(
        [sys.executable, "-m", "ebb", "coldstart"],
        env=platform.env(),
        stdout=standby_log,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
    )
    yield platform, standby
    standby.send_signal(signal.SIGTERM)
    standby.wait(timeout=60)
    standby_log.close()
    assert platform.stop() == 0


def leader_pid(redis_url: str) -> int | None:
    client = redis.Redis.from_url(redis_url)
    try:
        holder = client.get("ebb:controller:leader")
    finally:
        client.close()
    return int(holder.decode().rsplit("-", 1)[1]) if holder else None


def test_the_standby_takes_over_a_killed_leader_under_load(two_controllers, redis_url):
    platform, standby = two_controllers
    leader = wait_until(lambda: leader_pid(redis_url), 30, "a leader")
    supervised = {p.pid for p in processes(platform.home, "coldstart")}
    assert leader in supervised and leader != standby.pid, "ebb up's controller came first"
    with platform.admin() as admin:
        deploy(admin, "steady", "fake://m?step_ms=20", max_replicas=1, idle_timeout_s=60)
        client = platform.openai().with_options(max_retries=0, timeout=60)
        client.chat.completions.create(model="steady", messages=MESSAGES, max_tokens=4)
        [first] = deployment(admin, "steady")["runners"]

        answers: list[str] = []
        errors: list[BaseException] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                try:
                    reply = client.chat.completions.create(
                        model="steady", messages=MESSAGES, max_tokens=8
                    )
                    answers.append(reply.choices[0].message.content or "")
                except openai.APIError as e:
                    errors.append(e)

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        wait_until(lambda: len(answers) >= 10, 30, "load before the kill")
        standby_log = (platform.home / "standby.log").read_text(errors="replace")
        assert not LAUNCH_RE.findall(standby_log), "the standby acted while the leader lived"
        assert "leads (term" not in standby_log
        killed_at_s = time.time()
        os.kill(leader, signal.SIGKILL)
        new_leader = wait_until(
            lambda: (pid := leader_pid(redis_url)) not in (None, leader) and pid,
            6 * LEASE_S,
            "another controller to take the lease",
        )

        def second_runner_serves() -> dict | None:
            runners = deployment(admin, "steady")["runners"]
            ready = [r for r in runners if r["state"] == "ready" and r["id"] != first["id"]]
            return ready[0] if ready else None

        second = wait_until(second_runner_serves, 60, "the new leader's runner")
        served_before = len(answers)
        wait_until(lambda: len(answers) >= served_before + 10, 30, "load after the takeover")
        stop.set()
        for t in threads:
            t.join(timeout=60)
        runners = deployment(admin, "steady")["runners"]

    assert not errors, f"requests lost across the failover: {errors[:3]}"
    print(
        f"failover: lease taken {new_leader=}; new runner launched "
        f"{second['launched_ms'] / 1000 - killed_at_s:.2f}s after the kill "
        f"(lease {LEASE_S}s)"
    )
    # The old leader's runner drained (its parent died) rather than failing its requests.
    old = next(r for r in runners if r["id"] == first["id"])
    assert old["state"] in ("draining", "exited"), old
    launches = LAUNCH_RE.findall(
        (platform.home / "logs" / "coldstart.log").read_text(errors="replace")
        + (platform.home / "standby.log").read_text(errors="replace")
    )
    assert len(launches) == len(set(launches)), "a runner launched twice"
    assert sorted(launches) == sorted(r["id"] for r in runners), "one launch per runner"
    assert len(launches) == 2, "max_replicas=1: one runner per leader, never both at once"
