"""Weight-cache benchmark: S3 fetch throughput by stream count, and ensure() + engine load
against vLLM loading the same directory on its own, with the page cache warm and cold.

    .venv/bin/python -m bench.weights [--streams 1 2 4 8] [--rounds 2] [--loads 3]
                                      [--skip-fetch] [--skip-load]

Fetch: the default model's converted checkpoint (5 files, 270 MB) is uploaded to moto's S3
server, run as its own process; each run fetches it into an empty cache through ensure()
with 1..N parallel range streams (16 MiB ranges), verification and hashing included, and
the same ranges are then fetched bare (no disk, no hashing) as the server's ceiling. Runs go
direct to moto, then through a proxy capping each connection (as one S3 connection is
capped), where parallel ranges are what buys throughput. The server's and this process's
CPU use are sampled, to tell whether moto or the client bounds the throughput.

Load: each run is a fresh process that imports vLLM (not timed), then times either vLLM
building an engine from the checkpoint directory by itself (LLMEngine.from_engine_args, the
same engine arguments ebb uses) or ebb's path as a runner takes it (ensure() on a warm
cache, then VllmEngine.load). ebb is also timed with the checkpoint dropped from the page
cache, without and with a read-ahead hint issued as the load starts (the hot-tier
experiment, see page_cache.py). Modes alternate within each round; medians are reported.
Results go to bench/results/.
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
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support import TEST_WEIGHTS_DIR, free_port, temp_home, wait_until  # noqa: E402
from support.weights import CountingProxy  # noqa: E402

from bench.loadgen import save_results  # noqa: E402
from bench.page_cache import drop, read_ahead_in_background, resident_fraction  # noqa: E402
from ebb.config import DEFAULT_MODEL_SOURCE  # noqa: E402
from ebb.runners.engine_patches import CPU_DTYPE  # noqa: E402
from ebb.weights_cache import CacheOptions, ensure  # noqa: E402

MIB = 1024 * 1024
MAX_MODEL_LEN = 2048
LOAD_MODES = ("vllm", "ebb", "ebb-cold", "ebb-cold-hint")
# Like one S3 connection (tens of MB/s each): the reason to fetch in parallel ranges.
CAPPED_MB_PER_S = 16


# --- fetch ------------------------------------------------------------------------------------


def start_moto(log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        import httpx

        try:
            return httpx.get(url + "/moto-api/", timeout=1).status_code < 500
        except httpx.HTTPError:
            return False

    wait_until(up, 60, "moto_server to answer", poll_s=0.2)
    return proc, url


def fetch_once(source: str, cache_dir: Path, streams: int, server: psutil.Process) -> dict:
    shutil.rmtree(cache_dir, ignore_errors=True)
    me = psutil.Process()
    server_before, me_before = _cpu_s(server), _cpu_s(me)
    started = time.perf_counter()
    model = ensure(
        source, cache_dir, options=CacheOptions(concurrency=streams, part_bytes=16 * MIB)
    )
    elapsed_s = time.perf_counter() - started
    return {
        "streams": streams,
        "seconds": elapsed_s,
        "mb_per_s": model.size_bytes / elapsed_s / 1e6,
        "server_cpu": (_cpu_s(server) - server_before) / elapsed_s,
        "client_cpu": (_cpu_s(me) - me_before) / elapsed_s,
    }


def raw_once(client, keys: list[tuple[str, int]], streams: int) -> float:
    """MB/s of the same ranged GETs with nothing done to the bytes: the server's ceiling
    as this client sees it (no disk writes, no hashing)."""
    import concurrent.futures as cf

    ranges = [
        (key, start, min(start + 16 * MIB, size) - 1)
        for key, size in keys
        for start in range(0, size, 16 * MIB)
    ]

    def get(item) -> int:
        key, start, end = item
        body = client.get_object(Bucket="bench", Key=key, Range=f"bytes={start}-{end}")["Body"]
        return sum(len(chunk) for chunk in body.iter_chunks(256 * 1024))

    started = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=streams) as pool:
        total = sum(pool.map(get, ranges))
    return total / (time.perf_counter() - started) / 1e6


def _cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def bench_fetch(model_dir: Path, work: Path, streams: list[int], rounds: int) -> dict:
    proc, url = start_moto(work / "moto.log")
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID")}
    os.environ.update(
        AWS_ENDPOINT_URL_S3=url,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    try:
        import boto3

        client = boto3.client("s3")
        client.create_bucket(Bucket="bench")
        for path in sorted(model_dir.glob("*")):
            if path.is_file():
                client.upload_file(str(path), "bench", f"smol/{path.name}")
        keys = [(o["Key"], o["Size"]) for o in client.list_objects_v2(Bucket="bench")["Contents"]]
        server = psutil.Process(proc.pid)
        capped = CountingProxy(url, delay_s_per_mib=1 / CAPPED_MB_PER_S, shared_link=False)
        results = {}
        for link, endpoint in (("direct", url), ("capped", capped.url)):
            os.environ["AWS_ENDPOINT_URL_S3"] = endpoint
            print(f" {link}:")
            runs = []
            for r in range(rounds):
                for n in streams if r % 2 == 0 else list(reversed(streams)):
                    run = fetch_once("s3://bench/smol", work / "fetch-cache", n, server)
                    run["raw_mb_per_s"] = raw_once(boto3.client("s3"), keys, n)
                    print(
                        f"  streams={n}: {run['mb_per_s']:.0f} MB/s, bare GETs "
                        f"{run['raw_mb_per_s']:.0f} MB/s "
                        f"(moto {run['server_cpu']:.0%} CPU, client {run['client_cpu']:.0%})"
                    )
                    runs.append(run)
            results[link] = _summarize_fetch(runs, streams)
        capped.close()
        shutil.rmtree(work / "fetch-cache", ignore_errors=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
    return results


def _summarize_fetch(runs: list[dict], streams: list[int]) -> dict:
    by_n = {}
    for n in streams:
        mine = [r for r in runs if r["streams"] == n]
        by_n[n] = {
            key: statistics.median(r[key] for r in mine)
            for key in ("mb_per_s", "raw_mb_per_s", "seconds", "server_cpu", "client_cpu")
        }
    base = by_n[streams[0]]["mb_per_s"]
    for n in streams:
        by_n[n]["ratio_to_1"] = by_n[n]["mb_per_s"] / base
    return {"runs": runs, "by_streams": by_n}


# --- load -------------------------------------------------------------------------------------


def child(mode: str, model_dir: Path, cache_dir: Path) -> None:
    """One measured engine start, in a fresh process; prints one JSON line."""
    from ebb.runners import engine_vllm
    from ebb.runners.engine import EngineOptions

    engine_vllm.preload()
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    started = time.perf_counter()
    ensure_s = 0.0
    if mode == "vllm":
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        args = EngineArgs(
            model=str(model_dir),
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=32,
            seed=0,
            enforce_eager=True,
            dtype=CPU_DTYPE,
            disable_log_stats=True,
        )
        LLMEngine.from_engine_args(args)
    else:
        model = ensure(DEFAULT_MODEL_SOURCE, cache_dir, hold=True)
        ensure_s = time.perf_counter() - started
        if mode.endswith("hint"):
            read_ahead_in_background(model.path)
        options = EngineOptions(model.path, max_model_len=MAX_MODEL_LEN, max_num_seqs=32)
        engine_vllm.VllmEngine.load(options)
    print("RESULT " + json.dumps({"total_s": time.perf_counter() - started, "ensure_s": ensure_s}))


def load_once(mode: str, model_dir: Path, log_path: Path) -> dict:
    if mode.startswith("ebb-cold"):
        drop(model_dir)
    else:
        for path in model_dir.glob("*.safetensors"):
            path.read_bytes()  # warm: as right after a runner of this model exited
    resident = resident_fraction(model_dir)
    cmd = [sys.executable, "-m", "bench.weights", "--child", mode, "--model-dir", str(model_dir)]
    with open(log_path, "ab") as log:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, cwd=REPO, check=True)
    line = next(x for x in out.stdout.decode().splitlines() if x.startswith("RESULT "))
    return {"mode": mode, "resident_before": resident, **json.loads(line[len("RESULT ") :])}


def bench_load(model_dir: Path, work: Path, loads: int) -> dict:
    # One untimed start first: vLLM caches its model inspection under VLLM_CACHE_ROOT, and
    # whichever mode ran first would pay for it.
    load_once("vllm", model_dir, work / "load.log")
    runs = []
    for r in range(loads):
        order = LOAD_MODES[r % len(LOAD_MODES) :] + LOAD_MODES[: r % len(LOAD_MODES)]
        for mode in order:
            run = load_once(mode, model_dir, work / "load.log")
            print(
                f"  load {mode}: {run['total_s']:.2f} s (ensure {run['ensure_s'] * 1000:.0f} ms,"
                f" {run['resident_before']:.0%} in page cache before)"
            )
            runs.append(run)
    stats = {}
    for name, pick in (("median", statistics.median), ("min", min)):
        seconds = {m: pick(r["total_s"] for r in runs if r["mode"] == m) for m in LOAD_MODES}
        stats[name] = {
            "seconds": seconds,
            "ebb_to_vllm": seconds["ebb"] / seconds["vllm"],
            "cold_to_warm": seconds["ebb-cold"] / seconds["ebb"],
            "hint_to_no_hint_cold": seconds["ebb-cold-hint"] / seconds["ebb-cold"],
        }
    return {"runs": runs, **stats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--loads", type=int, default=3)
    parser.add_argument("--skip-fetch", action="store_true")
    parser.add_argument("--skip-load", action="store_true")
    parser.add_argument("--child", choices=LOAD_MODES)
    parser.add_argument("--model-dir", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.model_dir, TEST_WEIGHTS_DIR)
        return

    model = ensure(DEFAULT_MODEL_SOURCE, TEST_WEIGHTS_DIR)
    work = temp_home("ebb-bench-weights-")
    results: dict = {"model": str(model.path), "size_bytes": model.size_bytes}
    if not args.skip_fetch:
        print(f"S3 fetch of {model.size_bytes / 1e6:.0f} MB from moto_server:")
        results["fetch"] = bench_fetch(model.path, work, args.streams, args.rounds)
    if not args.skip_load:
        print("engine start from the checkpoint:")
        results["load"] = bench_load(model.path, work, args.loads)
    report(results)
    save_results("weights", results)


def report(results: dict) -> None:
    for link, fetch in results.get("fetch", {}).items():
        limit = f", each connection capped at {CAPPED_MB_PER_S} MiB/s" if link == "capped" else ""
        print(f"\nfetch throughput (median), {link}{limit}:")
        for n, row in fetch["by_streams"].items():
            print(
                f"  {n} streams: {row['mb_per_s']:6.0f} MB/s  x{row['ratio_to_1']:.2f} vs 1 stream"
                f"  (bare GETs {row['raw_mb_per_s']:.0f} MB/s; moto CPU {row['server_cpu']:.0%},"
                f" client CPU {row['client_cpu']:.0%})"
            )
    if "load" in results:
        # Both: the median is the usual run, the minimum the least disturbed one (on a
        # shared machine, other work only ever adds time).
        load = results["load"]
        print("\nengine start (seconds): median / min")
        median, least = load["median"], load["min"]
        for mode in LOAD_MODES:
            print(f"  {mode:14s} {median['seconds'][mode]:6.2f} / {least['seconds'][mode]:.2f}")
        for key, label in (
            ("ebb_to_vllm", "ebb (ensure + load, warm) / vLLM alone"),
            ("cold_to_warm", "ebb, cold page cache / warm"),
            ("hint_to_no_hint_cold", "cold: with a read-ahead hint / without"),
        ):
            print(f"  {label:40s} x{median[key]:.3f} / x{least[key]:.3f}")


if __name__ == "__main__":
    main()
