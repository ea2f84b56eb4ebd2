"""Memory footprint: RSS and PSS of every process of `ebb up`, idle and under load.

    .venv/bin/python -m bench.footprint [--requests 32 --concurrency 8]

Brings the platform up as `make run` does (default model deployed, one pre-warmed stem,
the fork server), measures each process once `ready:` is printed (idle, no runner serving)
and again at the peak of a burst of streamed requests at the default model (one runner
serving). The platform's own processes (everything but runners, stems and the fork
server, whose memory is the engine's) are summed against the 400 MB goal. PSS counts
pages shared between processes (the fork server and its children) once across them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from collections import defaultdict

import psutil

from bench.loadgen import run_level, save_results
from bench.serving import REPO

sys.path.insert(0, str(REPO / "tests"))

from support import TEST_WEIGHTS_DIR, Platform, temp_home  # noqa: E402

from ebb.config import DEFAULT_MODEL_NAME  # noqa: E402

GOAL_MB = 400
# Processes whose memory is the engine's: not counted against the platform's goal.
ENGINE_ROLES = ("runner", "stem", "fork-server", "forked")
MB = 1024 * 1024


def role_of(proc: psutil.Process) -> str:
    cmdline = proc.cmdline()
    if cmdline and cmdline[0].endswith("redis-server"):
        return "redis"
    if any("multiprocessing" in arg for arg in cmdline):
        # EBB_FRONTDOOR_WORKERS: uvicorn's workers (and its resource tracker) under it.
        parent = proc.parent()
        if parent is not None and "frontdoor" in parent.cmdline():
            return "frontdoor" if any("spawn_main" in a for a in cmdline) else "frontdoor-tracker"
    if "-m" in cmdline and "ebb" in cmdline:
        args = cmdline[cmdline.index("ebb") + 1 :]
        role = args[0] if args else "?"
        if role == "runner" and "--deployment" not in args:
            return "stem"
        parent = proc.parent()
        if role == "fork-server" and parent is not None and parent.cmdline() == cmdline:
            return "forked"  # a runner or stem forked from it carries its command line
        return role
    return proc.name()


def measure(platform: Platform) -> dict[str, dict[str, float]]:
    """{role: {count, rss_mb, pss_mb}} over `ebb up` and every process below it."""
    root = psutil.Process(platform.proc.pid)
    totals: dict[str, dict[str, float]] = defaultdict(
        lambda: {"count": 0, "rss_mb": 0, "pss_mb": 0}
    )
    for proc in [root, *root.children(recursive=True)]:
        try:
            role = "up" if proc.pid == root.pid else role_of(proc)
            memory = proc.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        entry = totals[role]
        entry["count"] += 1
        entry["rss_mb"] += memory.rss / MB
        entry["pss_mb"] += memory.pss / MB
    return dict(totals)


def peak_during(platform: Platform, load) -> dict[str, dict[str, float]]:
    """Each role's largest PSS (and the RSS beside it) sampled while `load()` runs."""
    peak: dict[str, dict[str, float]] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            for role, entry in measure(platform).items():
                if entry["pss_mb"] > peak.get(role, {}).get("pss_mb", -1):
                    peak[role] = entry

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        load()
    finally:
        done.set()
        sampler.join()
    return peak


def platform_total(snapshot: dict[str, dict[str, float]], field: str) -> float:
    return sum(e[field] for role, e in snapshot.items() if role not in ENGINE_ROLES)


def report(idle: dict, loaded: dict) -> None:
    roles = sorted(set(idle) | set(loaded), key=lambda r: (r in ENGINE_ROLES, r))
    columns = f"{'idle RSS':>9} {'idle PSS':>9} | {'load RSS':>9} {'load PSS':>9}"
    print(f"{'process':<12} {'n':>2} | {columns}")
    for role in roles:
        a, b = idle.get(role, {}), loaded.get(role, {})
        n = int(max(a.get("count", 0), b.get("count", 0)))
        print(
            f"{role:<12} {n:>2} | {a.get('rss_mb', 0):>8.0f}M {a.get('pss_mb', 0):>8.0f}M | "
            f"{b.get('rss_mb', 0):>8.0f}M {b.get('pss_mb', 0):>8.0f}M"
        )
    for name, snapshot in (("idle", idle), ("under load", loaded)):
        rss, pss = platform_total(snapshot, "rss_mb"), platform_total(snapshot, "pss_mb")
        print(
            f"platform (all but {', '.join(ENGINE_ROLES)}) {name}: RSS {rss:.0f} MB, "
            f"PSS {pss:.0f} MB — goal {GOAL_MB} MB: {'met' if rss <= GOAL_MB else 'not met'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()

    platform = Platform(
        home=temp_home("ebb-bench-footprint-"),
        redis_url=None,
        default_model=True,
        env_extra={
            "EBB_WEIGHTS_CACHE_DIR": str(TEST_WEIGHTS_DIR),
            "EBB_PREWARM": "1",
            "EBB_FORK_SERVER": "1",
        },
    ).start(timeout_s=900)
    try:
        idle = measure(platform)

        def load() -> None:
            asyncio.run(
                run_level(
                    platform.base_url + "/v1",
                    platform.admin_key,
                    DEFAULT_MODEL_NAME,
                    concurrency=args.concurrency,
                    requests=args.requests,
                    max_tokens=32,
                )
            )

        loaded = peak_during(platform, load)
    finally:
        platform.stop()
    report(idle, loaded)
    save_results("footprint", {"idle": idle, "under_load": loaded})


if __name__ == "__main__":
    main()
