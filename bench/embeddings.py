"""Embeddings benchmark: ebb against vLLM's own OpenAI server in pooling mode, same weights,
same machine, same run.

    .venv/bin/python -m bench.embeddings [--concurrency 8] [--requests 64] [--inputs 4]

Both serve the default model's weights as an embedding model (vLLM's pooling runner,
`--runner pooling --convert embed`, which is what an ebb deployment with
`"serving": {"task": "embed"}` runs), eager, with the same KV cache. Each request embeds
`--inputs` short texts (float vectors). The two are measured alternately, `--rounds`
times each, so machine noise hits both alike; each is idle while the other is measured.
Prints inputs/s and prompt tokens/s of each and ebb's ratio to vLLM (target >= 0.9).
Results go to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.loadgen import TOPICS, save_results
from bench.serving import KV_CACHE_GIB, MAX_MODEL_LEN

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support import TEST_WEIGHTS_DIR, Platform, free_port, temp_home, wait_until  # noqa: E402

from ebb.config import DEFAULT_MODEL_SOURCE  # noqa: E402
from ebb.runners.engine_patches import CPU_DTYPE  # noqa: E402
from ebb.weights_cache import ensure  # noqa: E402


@dataclass
class Round:
    wall_s: float
    inputs: int
    prompt_tokens: int
    errors: int

    @property
    def inputs_per_s(self) -> float:
        return self.inputs / self.wall_s


def start_vllm_pooling(model_dir: Path, port: int, log_path: Path) -> subprocess.Popen:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=KV_CACHE_GIB)
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        "smol-embed",
        "--runner",
        "pooling",
        "--convert",
        "embed",
        "--enforce-eager",
        "--dtype",
        CPU_DTYPE,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        "32",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
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

    wait_until(up, 600, "vLLM's pooling server to answer", poll_s=0.5)
    return proc


def start_ebb(home: Path) -> Platform:
    platform = Platform(
        home=home,
        redis_url=None,
        default_model=False,
        env_extra={
            "EBB_WEIGHTS_CACHE_DIR": str(TEST_WEIGHTS_DIR),
            "EBB_KV_CACHE_GIB": KV_CACHE_GIB,
        },
    ).start()
    with platform.admin() as admin:
        admin.post(
            "/v1/deployments",
            json={
                "name": "smol-embed",
                "source": DEFAULT_MODEL_SOURCE,
                "min_replicas": 1,
                "max_concurrency": 32,
                "max_model_len": MAX_MODEL_LEN,
                "idle_timeout_s": 3600,
                "serving": {"task": "embed"},
            },
        ).raise_for_status()
        wait_until(
            lambda: admin.get("/v1/deployments/smol-embed").json()["status"] == "ready",
            600,
            "ebb's embedding runner to be ready",
            poll_s=0.5,
        )
    return platform


def _inputs(i: int, count: int) -> list[str]:
    return [
        f"A short note about {TOPICS[(i * count + k) % len(TOPICS)]}, number {i}-{k}."
        for k in range(count)
    ]


async def run_round(
    base_url: str, key: str, *, concurrency: int, requests: int, inputs: int
) -> Round:
    url = base_url.rstrip("/") + "/embeddings"
    counter = iter(range(requests))
    done = Round(wall_s=0.0, inputs=0, prompt_tokens=0, errors=0)
    limits = httpx.Limits(max_connections=concurrency + 4)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(headers=headers, timeout=300, limits=limits) as client:

        async def worker() -> None:
            for i in counter:
                body = {
                    "model": "smol-embed",
                    "input": _inputs(i, inputs),
                    "encoding_format": "float",
                }
                try:
                    response = await client.post(url, json=body)
                    response.raise_for_status()
                except httpx.HTTPError:
                    done.errors += 1
                    continue
                reply = response.json()
                done.inputs += len(reply["data"])
                done.prompt_tokens += reply["usage"]["prompt_tokens"]

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        done.wall_s = time.perf_counter() - start
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--inputs", type=int, default=4, help="texts per request")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per server")
    args = parser.parse_args()

    model = ensure(DEFAULT_MODEL_SOURCE, TEST_WEIGHTS_DIR)
    work = temp_home("ebb-bench-embed-")
    port = free_port()
    vllm = start_vllm_pooling(model.path, port, work / "vllm-pooling.log")
    ebb = start_ebb(work / "ebb")
    targets = {
        "vllm": (f"http://127.0.0.1:{port}/v1", "none"),
        "ebb": (ebb.base_url + "/v1", ebb.admin_key),
    }
    rounds: dict[str, list[Round]] = {"vllm": [], "ebb": []}
    try:
        for base_url, key in targets.values():  # warm both
            asyncio.run(run_round(base_url, key, concurrency=2, requests=4, inputs=args.inputs))
        for r in range(args.rounds):
            for name in ("vllm", "ebb") if r % 2 == 0 else ("ebb", "vllm"):
                base_url, key = targets[name]
                rounds[name].append(
                    asyncio.run(
                        run_round(
                            base_url,
                            key,
                            concurrency=args.concurrency,
                            requests=args.requests,
                            inputs=args.inputs,
                        )
                    )
                )
    finally:
        ebb.stop()
        vllm.terminate()
        vllm.wait(timeout=60)
    report(rounds, args)


def report(rounds: dict[str, list[Round]], args: argparse.Namespace) -> None:
    summary = {}
    for name, done in rounds.items():
        rates = [r.inputs_per_s for r in done]
        summary[name] = {
            "inputs_per_s": [round(x, 2) for x in rates],
            "median_inputs_per_s": round(statistics.median(rates), 2),
            "prompt_tokens_per_s": round(
                sum(r.prompt_tokens for r in done) / sum(r.wall_s for r in done), 1
            ),
            "errors": sum(r.errors for r in done),
        }
    ratio = summary["ebb"]["median_inputs_per_s"] / summary["vllm"]["median_inputs_per_s"]
    for name, s in summary.items():
        print(
            f"{name:>5}: {s['median_inputs_per_s']:.1f} inputs/s (rounds {s['inputs_per_s']}), "
            f"{s['prompt_tokens_per_s']:.0f} prompt tok/s, {s['errors']} errors"
        )
    print(f"ebb / vLLM throughput: {ratio:.3f} (target >= 0.9)")
    save_results("embeddings", {"args": vars(args), "servers": summary, "ratio": round(ratio, 3)})


if __name__ == "__main__":
    main()
