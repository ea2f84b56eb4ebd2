"""The Ray two-node scenario, run inside its own network namespace by
tests/integration/test_ray_cluster.py (never on the machine's interfaces): a head and a
worker node on 127.0.0.1, `ebb up` with EBB_LAUNCHER=ray on the head, runners asking for
the worker's custom resource. Exits 0 when every check passed; prints what it measured."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from ebb.config import DEFAULT_MODEL_SOURCE
from support import (
    TEST_WEIGHTS_DIR,
    Platform,
    deploy,
    deployment,
    free_port,
    temp_home,
    wait_for_weights,
    wait_until,
)

RAY = str(Path(sys.executable).with_name("ray"))
NODE_MEMORY = str(1024**3)
OBJECT_STORE = str(128 * 1024**2)
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def start_node(args: list[str], log: Path) -> subprocess.Popen:
    """A Ray node as `ray start --block` in a session of its own: every process of the
    node is in it, so the node can be stopped (or killed) by that id alone."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                RAY,
                "start",
                "--block",
                "--node-ip-address=127.0.0.1",
                "--memory",
                NODE_MEMORY,
                "--object-store-memory",
                OBJECT_STORE,
                "--disable-usage-stats",
                *args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def session_pids(leader: int) -> list[int]:
    return [p.pid for p in psutil.process_iter() if _sid(p.pid) == leader]


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def pss_mib(leader: int) -> float:
    total = 0
    for pid in session_pids(leader):
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_full_info().pss
    return total / 2**20


def kill_session(leader: int, sig: int) -> None:
    for pid in session_pids(leader):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stop_node(node: subprocess.Popen) -> None:
    kill_session(node.pid, signal.SIGTERM)
    try:
        wait_until(lambda: not session_pids(node.pid), 15, "the Ray node to stop")
    except AssertionError:
        kill_session(node.pid, signal.SIGKILL)  # gcs_server may ignore SIGTERM
    node.wait(timeout=10)


def job(admin, job_id: str) -> dict:
    return admin.get(f"/v1/jobs/{job_id}").json()


def runner_of(admin, name: str, state: str) -> dict | None:
    found = [r for r in deployment(admin, name)["runners"] if r["state"] == state]
    return found[0] if found else None


def main() -> int:
    home = temp_home("ebb-ray-")
    port = free_port()
    t0 = time.monotonic()
    head = start_node(
        [
            "--head",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            f"--temp-dir={home / 'ray'}",
        ],
        home / "ray-head.log",
    )
    worker = start_node(
        [
            f"--address=127.0.0.1:{port}",
            "--num-cpus=2",
            "--resources=" + json.dumps({"ebb_worker": 1}),
        ],
        home / "ray-worker.log",
    )
    platform = None
    try:
        env = {
            "EBB_LAUNCHER": "ray",
            "EBB_RAY_ADDRESS": f"127.0.0.1:{port}",
            "EBB_RAY_RUNNER_RESOURCES": json.dumps({"ebb_worker": 1}),
            "EBB_ADMISSION_TIMEOUT_S": "120",
            # The node-loss check runs a job beside a streaming request on one runner; on
            # a runner without GPUs jobs otherwise wait for synchronous traffic to end.
            "EBB_JOB_SLOTS_BESIDE_SYNC": "1",
        }
        real = "--real-engine" in sys.argv
        if real:  # the weights the test session converted once; no engine from a hub
            env["EBB_WEIGHTS_CACHE_DIR"] = str(TEST_WEIGHTS_DIR)
            # A pre-warmed stem: an actor on the worker node (what runners ask for) that
            # imported the engine and waits for an assignment; `ebb up` is ready once it does.
            env["EBB_PREWARM"] = "1"
        platform = Platform(home=home / "ebb", redis_url=None, env_extra=env).start()
        print(f"ray cluster and ebb up in {time.monotonic() - t0:.1f}s")
        print(
            f"ray nodes' memory: head PSS {pss_mib(head.pid):.0f} MiB, "
            f"worker PSS {pss_mib(worker.pid):.0f} MiB"
        )
        with platform.admin() as admin:
            if real:
                check_the_real_engine_answers_from_the_worker(platform, admin, worker)
                return 0
            check_runner_lands_on_the_worker_and_drains(platform, admin, worker)
            check_killing_the_worker_mid_request_ends_cleanly(platform, admin, worker)
        return 0
    finally:
        if platform is not None:
            platform.stop()
        for node in (worker, head):
            stop_node(node)


def check_the_real_engine_answers_from_the_worker(platform, admin, worker) -> None:
    """The pre-warmed stem (a Ray actor on the worker) becomes the deployment's runner."""
    deploy(admin, "remote-real", DEFAULT_MODEL_SOURCE, idle_timeout_s=2)
    wait_for_weights(admin, "remote-real")
    t = time.monotonic()
    reply = platform.openai(timeout=600).chat.completions.create(
        model="remote-real", messages=MESSAGES, max_tokens=16, temperature=0
    )
    print(f"real engine on the worker node, cold start to the answer: {time.monotonic() - t:.1f}s")
    assert "Paris" in (reply.choices[0].message.content or ""), reply
    [runner] = deployment(admin, "remote-real")["runners"]
    assert _sid(runner["pid"]) == worker.pid, "the runner runs on the worker node"
    assert runner["tier"] == "prewarmed", "the stem actor waiting on the worker answered"
    wait_until(lambda: runner_of(admin, "remote-real", "exited"), 120, "the runner to drain")


def check_runner_lands_on_the_worker_and_drains(platform, admin, worker) -> None:
    deploy(admin, "remote", "fake://m?step_ms=20", idle_timeout_s=2)
    t = time.monotonic()
    reply = platform.openai(timeout=180).chat.completions.create(
        model="remote", messages=MESSAGES, max_tokens=4
    )
    print(f"cold start through Ray to the first answer: {time.monotonic() - t:.2f}s")
    assert reply.choices[0].message.content
    [runner] = deployment(admin, "remote")["runners"]
    assert _sid(runner["pid"]) == worker.pid, "the runner runs on the worker node"
    wait_until(lambda: runner_of(admin, "remote", "exited"), 60, "the runner to drain to zero")
    live = [r for r in deployment(admin, "remote")["runners"] if r["state"] not in ("exited",)]
    assert not live, live


def check_killing_the_worker_mid_request_ends_cleanly(platform, admin, worker) -> None:
    deploy(admin, "doomed", "fake://m?step_ms=50", idle_timeout_s=60)
    events: list[str] = []
    done = threading.Event()

    def stream() -> None:
        # Two choices: no continuation can replay them (a single one would go on on
        # another runner, see test_continuation.py), so the loss is the answer.
        body = {"model": "doomed", "messages": MESSAGES, "max_tokens": 1500, "stream": True, "n": 2}
        with admin.stream("POST", "/v1/chat/completions", json=body, timeout=180) as response:
            if response.status_code != 200:
                events.append(f"refused {response.status_code}: {response.read()!r}")
                done.set()
                return
            events.extend(line for line in response.iter_lines() if line.startswith("data: "))
        done.set()

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    wait_until(lambda: len(events) >= 3 or done.is_set(), 180, "the stream to start")
    assert not events[0].startswith("refused"), events[0]
    # A job on the same runner: lost with it, it must go back to the queue, not vanish
    # (as a new attempt: with two choices no continuation replays it).
    body = {"messages": MESSAGES, "max_tokens": 1500, "n": 2}
    accepted = admin.post(
        "/v1/jobs", json={"model": "doomed", "endpoint": "chat.completions", "body": body}
    )
    assert accepted.status_code == 202, accepted.text
    job_id = accepted.json()["id"]
    wait_until(lambda: job(admin, job_id)["status"] == "running", 60, "the job to run")
    killed_at = time.monotonic()
    kill_session(worker.pid, signal.SIGKILL)  # the machine dies: node, actor and runner
    assert done.wait(120), "the stream hung after its node died"
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][len("data: ") :])["error"]
    assert error["code"] == "runner_lost", error
    print(f"stream ended with runner_lost {time.monotonic() - killed_at:.1f}s after the kill")
    failed = wait_until(lambda: runner_of(admin, "doomed", "failed"), 120, "the runner failed")
    print(f"runner marked failed: {failed['id']}")
    requeued = wait_until(
        lambda: (j := job(admin, job_id))["status"] == "queued" and j, 120, "the job requeued"
    )
    print(f"job requeued after its runner was lost: attempts={requeued['attempts']}")


if __name__ == "__main__":
    sys.exit(main())
