"""Cold start from zero through Ray vs on the local host, same run, real engine.

    .venv/bin/python -m bench.ray_coldstart [--rounds 3]

A Ray head and a worker node on 127.0.0.1, inside a network namespace of this process's
own (`unshare -n`, only `lo`, up: Ray binds nothing else), and two platforms, both up at
once so that their rounds alternate under the same load:
  local  EBB_LAUNCHER=local: a pre-warmed stem is a process on this host;
  ray    EBB_LAUNCHER=ray: a pre-warmed stem is a Ray actor on the worker node (the
         runners' resource only the worker offers).
Each round, once both pools hold a stem that imported the engine, a request goes to a
deployment of the default model at zero runners: the stem is assigned, loads the cached
weights, answers; the time to its first token is the cold start. The deployment then
drains to zero and the pool refills before the next round. Prints each round, the medians
and the ratio ray/local (the overhead of going through Ray; target <= 1.2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from bench.coldstart import read_into_page_cache, request_timing
from bench.serving import KV_CACHE_GIB, MAX_MODEL_LEN, REPO

sys.path.insert(0, str(REPO / "tests"))

from support import (  # noqa: E402
    TEST_WEIGHTS_DIR,
    Platform,
    free_port,
    temp_home,
    wait_for_weights,
    wait_until,
)
from support.ray_two_nodes import _sid, start_node, stop_node  # noqa: E402

from ebb.config import DEFAULT_MODEL_SOURCE  # noqa: E402
from ebb.weights_cache import ensure  # noqa: E402

_IN_NAMESPACE = "EBB_BENCH_IN_NETNS"
WORKER_RESOURCE = {"ebb_worker": 1}


def reexec_in_namespace() -> int:
    """This script again, in a new network namespace with only `lo`, up."""
    assert shutil.which("unshare") and shutil.which("ip"), "util-linux and iproute2"
    argv = " ".join([sys.executable, "-m", "bench.ray_coldstart", *sys.argv[1:]])
    env = dict(os.environ, **{_IN_NAMESPACE: "1"})
    script = f"ip link set lo up && exec {argv}"
    return subprocess.run(["unshare", "-n", "--", "sh", "-c", script], env=env, cwd=REPO).returncode


def stems_ready(admin) -> bool:
    pool = admin.get("/v1/status").json()["pool"]
    return pool["prewarmed"] >= 1 and pool["starting"] == 0


def live_runners(admin) -> list[dict]:
    runners = admin.get("/v1/deployments/smol").json()["runners"]
    return [r for r in runners if r["state"] not in ("exited", "failed")]


def quiet(platforms: dict[str, Platform]) -> None:
    """Every platform at zero runners with its stem pre-warmed: no drain, no refill (an
    engine import) competes for the cores with the cold start about to be timed."""
    for platform in platforms.values():
        with platform.admin() as admin:
            wait_until(lambda: not live_runners(admin), 300, "the deployment at zero", poll_s=0.2)
            wait_until(lambda: stems_ready(admin), 300, "a pre-warmed stem", poll_s=0.2)


def one_round(platform: Platform, admin) -> dict:
    """One cold start from zero off the pre-warmed stem."""
    sent, first_token = request_timing(platform.base_url + "/v1", platform.admin_key, "smol")
    [runner] = live_runners(admin)
    return {"first_token_s": round(first_token - sent, 2), "tier": runner["tier"], **runner}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if os.environ.get(_IN_NAMESPACE) != "1":
        return reexec_in_namespace()
    model = ensure(DEFAULT_MODEL_SOURCE, TEST_WEIGHTS_DIR)
    work = temp_home("ebb-ray-coldstart-")
    port = free_port()
    head = start_node(
        [
            "--head",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            f"--temp-dir={work / 'ray'}",
        ],
        work / "ray-head.log",
    )
    worker = start_node(
        [
            f"--address=127.0.0.1:{port}",
            "--num-cpus=2",
            "--resources=" + json.dumps(WORKER_RESOURCE),
        ],
        work / "ray-worker.log",
    )
    common = {
        "EBB_PREWARM": "1",
        "EBB_WEIGHTS_CACHE_DIR": str(TEST_WEIGHTS_DIR),
        "EBB_KV_CACHE_GIB": KV_CACHE_GIB,
        "EBB_ADMISSION_TIMEOUT_S": "300",
    }
    ray_env = {
        "EBB_LAUNCHER": "ray",
        "EBB_RAY_ADDRESS": f"127.0.0.1:{port}",
        "EBB_RAY_RUNNER_RESOURCES": json.dumps(WORKER_RESOURCE),
    }
    platforms: dict[str, Platform] = {}
    results: dict[str, list[dict]] = {"local": [], "ray": []}
    try:
        for name, extra in (("local", {}), ("ray", ray_env)):
            platforms[name] = Platform(
                home=work / name, redis_url=None, env_extra={**common, **extra}
            ).start(timeout_s=600)
            with platforms[name].admin() as admin:
                created = admin.post(
                    "/v1/deployments",
                    json={
                        "name": "smol",
                        "source": DEFAULT_MODEL_SOURCE,
                        "max_model_len": MAX_MODEL_LEN,
                        "admission_timeout_s": 300,
                        "idle_timeout_s": 2,
                    },
                )
                created.raise_for_status()
                wait_for_weights(admin, "smol", 300)
        read_into_page_cache(model.path)
        for n in range(args.rounds):
            for name, platform in platforms.items():
                quiet(platforms)
                with platform.admin() as admin:
                    result = one_round(platform, admin)
                on_worker = _sid(result["pid"]) == worker.pid
                result["on_ray_worker"] = on_worker
                results[name].append(result)
                print(
                    f"round {n + 1} {name:>5}: first token {result['first_token_s']:.2f} s "
                    f"(tier {result['tier']}, on the Ray worker node: {on_worker})",
                    flush=True,
                )
    finally:
        for platform in platforms.values():
            platform.stop()
        for node in (worker, head):
            stop_node(node)
    medians = {k: statistics.median(r["first_token_s"] for r in v) for k, v in results.items()}
    ratio = medians["ray"] / medians["local"]
    print(
        f"median cold start to first token: local {medians['local']:.2f} s, "
        f"ray worker {medians['ray']:.2f} s, ratio ray/local {ratio:.2f} (target <= 1.2)"
    )
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"ray-coldstart-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"medians_s": medians, "ratio": ratio, "rounds": results}, indent=2))
    print(f"results: {path}")
    bad = [r for r in results["ray"] if not r["on_ray_worker"] or r["tier"] != "prewarmed"]
    bad += [r for r in results["local"] if r["tier"] != "prewarmed"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
