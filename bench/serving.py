"""Serving benchmark: ebb against vLLM's own OpenAI server, same model, same machine, same run.

    .venv/bin/python -m bench.serving [--levels 1 8 32] [--requests 64] [--max-tokens 32]
                                      [--rounds 1] [--variant NAME:KEY=VALUE[,...]]

Both servers run the default model (SmolLM2-135M-Instruct) in eager mode with the same KV
cache. They are measured alternately, level by level, so machine noise hits both alike;
each is idle while the other is measured. With `--rounds N`, each level is measured N
times per server, alternating, and the rounds are pooled: at concurrency 1 a single round
of a shared 2-core machine varies by several percent, more than the gap being measured.
Each `--variant` adds one more ebb platform, started with that environment (an option off,
say: `unpinned:EBB_ENGINE_CORE_PIN=0`), measured in the same rounds.
Prints, per level and ebb platform, requests/s, median time to first token (TTFT) and
median time per output token after the first (TPOT), with their ratios to vLLM's and,
with several rounds, the range of the rounds' throughput ratios. Results (output tokens/s
too) go to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx

from bench.loadgen import LevelResult, run_level, save_results

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support import TEST_WEIGHTS_DIR, Platform, free_port, temp_home, wait_until  # noqa: E402

from ebb.config import DEFAULT_MODEL_SOURCE  # noqa: E402
from ebb.runners.engine_patches import CPU_DTYPE  # noqa: E402
from ebb.weights_cache import ensure  # noqa: E402

MAX_MODEL_LEN = 2048
KV_CACHE_GIB = "1"


def start_vllm_server(
    model_dir: Path, port: int, log_path: Path, *, gpu: bool = False
) -> subprocess.Popen:
    """vLLM's OpenAI server, eager, as ebb's runners run: on CPU in their dtype, on a GPU
    (`gpu`) in vLLM's default dtype."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=KV_CACHE_GIB)
    # The dtype ebb's runners use on CPU: the same arithmetic on both sides.
    dtype = [] if gpu else ["--dtype", CPU_DTYPE]
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        "smol",
        "--enforce-eager",
        *dtype,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--max-num-seqs",
        "32",
    ]
    log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM server exited; see {log_path}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 600, "vLLM's server to answer", poll_s=0.5)
    return proc


def start_ebb(home: Path, env: dict[str, str] | None = None) -> Platform:
    platform = Platform(
        home=home,
        redis_url=None,
        default_model=False,
        env_extra={
            "EBB_WEIGHTS_CACHE_DIR": str(TEST_WEIGHTS_DIR),
            "EBB_KV_CACHE_GIB": KV_CACHE_GIB,
            **(env or {}),
        },
    ).start()
    with platform.admin() as admin:
        created = admin.post(
            "/v1/deployments",
            json={
                "name": "smol",
                "source": DEFAULT_MODEL_SOURCE,
                "min_replicas": 1,
                "max_concurrency": 32,
                "max_model_len": MAX_MODEL_LEN,
                "idle_timeout_s": 3600,
            },
        )
        created.raise_for_status()
        wait_until(
            lambda: admin.get("/v1/deployments/smol").json()["status"] == "ready",
            600,
            "ebb's runner to be ready",
            poll_s=0.5,
        )
    return platform


def _warm(base_url: str, key: str) -> None:
    asyncio.run(run_level(base_url, key, "smol", concurrency=2, requests=4, max_tokens=8))


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """`NAME:KEY=VALUE[,KEY=VALUE...]`: one more ebb platform, with that environment."""
    name, sep, assignments = text.partition(":")
    env = dict(pair.split("=", 1) for pair in assignments.split(",") if "=" in pair)
    if not sep or not name or name in ("vllm", "ebb") or not env:
        raise argparse.ArgumentTypeError(
            f"--variant {text!r}: expected NAME:KEY=VALUE[,KEY=VALUE...], NAME not vllm or ebb"
        )
    return name, env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--requests", type=int, default=64, help="requests per level (at least 2x the concurrency)"
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--rounds", type=int, default=1, help="alternating measurements per level and server"
    )
    parser.add_argument(
        "--variant",
        type=parse_variant,
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE[,...]",
        help="also measure an ebb platform started with this environment "
        "(e.g. unpinned:EBB_ENGINE_CORE_PIN=0), in the same rounds",
    )
    args = parser.parse_args()

    model = ensure(DEFAULT_MODEL_SOURCE, TEST_WEIGHTS_DIR)
    work = temp_home("ebb-bench-")
    vllm_port = free_port()
    vllm = start_vllm_server(model.path, vllm_port, work / "vllm-server.log")
    platforms = {"ebb": start_ebb(work / "ebb")}
    try:
        for name, env in args.variant:
            platforms[name] = start_ebb(work / name, env)
        targets = {"vllm": (f"http://127.0.0.1:{vllm_port}/v1", "none")}
        targets |= {name: (p.base_url + "/v1", p.admin_key) for name, p in platforms.items()}
        # Per server, per level: one result per round.
        results: dict[str, list[list[LevelResult]]] = {name: [] for name in targets}
        for base_url, key in targets.values():
            _warm(base_url, key)
        names = list(targets)
        for level in args.levels:
            requests = max(args.requests, 2 * level)
            for rounds in results.values():
                rounds.append([])
            for turn in range(args.rounds):
                # Each server goes first in turn, so a drift of the machine's speed within
                # a round favours none of them.
                first = (level + turn) % len(names)
                for name in names[first:] + names[:first]:
                    base_url, key = targets[name]
                    results[name][-1].append(
                        asyncio.run(
                            run_level(
                                base_url,
                                key,
                                "smol",
                                concurrency=level,
                                requests=requests,
                                max_tokens=args.max_tokens,
                            )
                        )
                    )
    finally:
        for platform in platforms.values():
            platform.stop()
        vllm.terminate()
        vllm.wait(timeout=60)
    report(results, args)


def report(results: dict[str, list[list[LevelResult]]], args: argparse.Namespace) -> None:
    """One row per level and ebb platform: its figures against vLLM's in the same rounds."""
    rows = []
    print(
        f"{'conc':>4} {'platform':>10} | {'vLLM req/s':>10} {'req/s':>7} {'ratio':>6} | "
        f"{'vLLM TTFT':>9} {'TTFT':>7} {'Δ ms':>7} | {'vLLM TPOT':>9} {'TPOT':>7} {'ratio':>6}"
        + (" | rounds' ratios" if args.rounds > 1 else "")
    )
    for name in [n for n in results if n != "vllm"]:
        for v_rounds, e_rounds in zip(results["vllm"], results[name], strict=True):
            v, e = LevelResult.pooled(v_rounds), LevelResult.pooled(e_rounds)
            round_ratios = [
                round(er.requests_per_s / vr.requests_per_s, 3)
                for vr, er in zip(v_rounds, e_rounds, strict=True)
            ]
            v_tpot, e_tpot = v.median_tpot_ms, e.median_tpot_ms
            tpot_ratio = round(e_tpot / v_tpot, 3) if v_tpot and e_tpot else None
            row = {
                "concurrency": v.concurrency,
                "platform": name,
                "vllm": v.summary(),
                "ebb": e.summary(),
                "throughput_ratio": round(e.requests_per_s / v.requests_per_s, 3),
                "round_throughput_ratios": round_ratios,
                "ttft_delta_ms": round(e.median_ttft_ms - v.median_ttft_ms, 1),
                "tpot_ratio": tpot_ratio,
            }
            rows.append(row)
            spread = (
                f" | {min(round_ratios):.2f}-{max(round_ratios):.2f}" if args.rounds > 1 else ""
            )
            print(
                f"{v.concurrency:>4} {name:>10} | {v.requests_per_s:>10.2f} "
                f"{e.requests_per_s:>7.2f} {row['throughput_ratio']:>6.2f} | "
                f"{v.median_ttft_ms:>7.0f}ms {e.median_ttft_ms:>5.0f}ms "
                f"{row['ttft_delta_ms']:>+7.1f} | {v_tpot or 0:>7.1f}ms {e_tpot or 0:>5.1f}ms "
                f"{tpot_ratio or 0:>6.3f}{spread}"
            )
    save_results("serving", {"args": vars(args), "levels": rows})


if __name__ == "__main__":
    main()
