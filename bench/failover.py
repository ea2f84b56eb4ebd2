"""Controller failover: from SIGKILLing the leading controller to the standby's first
scale-up decision (the new runner's record, written before its launch).

    .venv/bin/python -m bench.failover [--trials 3] [--lease-s 2]

`ebb up` (fake engine, one controller) plus a second `ebb coldstart` on the same Redis.
Each trial: the deployment is at zero, the leader is killed, a request arrives at once;
the time until a runner record for it appears, in seconds and in lease periods (target
<= 2). Baseline, same run: the same request at zero with the leader alive. Also the
standby's memory (RSS/PSS), the cost of running one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

import openai
import psutil
import redis

from bench.serving import REPO

sys.path.insert(0, str(REPO / "tests"))

from support import Platform, RedisServer, deploy, deployment, free_port, temp_home, wait_until  # noqa: E402

MESSAGES = [{"role": "user", "content": "hi"}]


def leader_pid(client: redis.Redis) -> int | None:
    holder = client.get("ebb:controller:leader")
    return int(holder.decode().rsplit("-", 1)[1]) if holder else None


def decision_s(platform: Platform, admin, name: str, before: set[str], t0: float) -> float:
    """Send a request now (in the background); seconds from `t0` to its runner's record."""
    client = platform.openai(timeout=120)

    def ask() -> None:
        # Its answer is not measured; a 503 (a start slower than admission) is not either.
        with contextlib.suppress(openai.APIError):
            client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=2)

    threading.Thread(target=ask, daemon=True).start()
    new = wait_until(
        lambda: [r for r in deployment(admin, name)["runners"] if r["id"] not in before],
        60,
        "a scale-up decision",
        poll_s=0.01,
    )
    return new[0]["launched_ms"] / 1000 - t0


def at_zero(admin, name: str) -> set[str]:
    wait_until(
        lambda: all(r["state"] in ("exited", "failed") for r in deployment(admin, name)["runners"]),
        60,
        "the deployment at zero",
    )
    return {r["id"] for r in deployment(admin, name)["runners"]}


def start_standby(platform: Platform) -> subprocess.Popen:
    log = open(platform.home / "standby.log", "ab")  # noqa: SIM115 - lives with the process
    return subprocess.Popen(
        [sys.executable, "-m", "ebb", "coldstart"],
        env=platform.env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--lease-s", type=float, default=2.0)
    args = parser.parse_args()
    server = RedisServer(port=free_port(), data_dir=temp_home("ebb-bench-redis-")).start()
    # The fake engine: the decision, not the engine, is measured.
    env = {"EBB_CONTROLLER_LEASE_S": str(args.lease_s), "EBB_TEST_ENGINES": "1"}
    platform = Platform(home=temp_home("ebb-bench-failover-"), redis_url=server.url, env_extra=env)
    platform.start()
    client = redis.Redis.from_url(server.url)
    standby = start_standby(platform)
    try:
        with platform.admin() as admin:
            deploy(admin, "m", "fake://m", idle_timeout_s=1)
            decision_s(platform, admin, "m", set(), time.time())  # warm-up: the first start
            base = []
            for _ in range(args.trials):
                before = at_zero(admin, "m")
                base.append(decision_s(platform, admin, "m", before, time.time()))
            failover = []
            for _ in range(args.trials):
                before = at_zero(admin, "m")
                wait_until(lambda: leader_pid(client), 30, "a leader")
                leader = leader_pid(client)
                if standby.poll() is not None:
                    standby = start_standby(platform)
                time.sleep(args.lease_s)  # the standby has tried at least once since it started
                t0 = time.time()
                os.kill(leader, signal.SIGKILL)
                failover.append(decision_s(platform, admin, "m", before, t0))
            mem = psutil.Process(standby.pid).memory_full_info()
        med_f, med_b = statistics.median(failover), statistics.median(base)
        print(f"lease period: {args.lease_s:.1f}s, {args.trials} trials each")
        print(f"baseline (leader alive): median {med_b:.3f}s  {[round(x, 3) for x in base]}")
        print(
            f"failover (leader killed): median {med_f:.3f}s = {med_f / args.lease_s:.2f} lease "
            f"periods, max {max(failover) / args.lease_s:.2f}  {[round(x, 3) for x in failover]}"
        )
        print(f"ratio failover/baseline: {med_f / med_b:.1f}x")
        print(f"standby controller: RSS {mem.rss / 2**20:.0f} MiB, PSS {mem.pss / 2**20:.0f} MiB")
    finally:
        standby.send_signal(signal.SIGTERM)
        standby.wait(timeout=60)
        platform.stop()
        server.stop()


if __name__ == "__main__":
    main()
