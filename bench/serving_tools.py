"""The serving benchmarks users run, pointed at ebb and at vLLM's own OpenAI server in one run.

    .venv/bin/python -m bench.serving_tools [--requests 32] [--concurrency 8]
                                            [--input-tokens 64] [--output-tokens 32]
                                            [--guidellm PATH]

Tools: `vllm bench serve` (vLLM's serving benchmark, `vllm.benchmarks.serve`, as a library:
its default OpenAI Completions backend, random prompts, streamed) and guidellm's default
streaming run over Chat Completions (a fixed number of requests at a fixed concurrency,
synthetic prompts). guidellm pins older versions of packages ebb's venv carries (click,
multidict), so it is run from its own venv, layered over ebb's (see docs/CLIENTS.md);
without one (`--guidellm` or `guidellm` on PATH), its rows are skipped and say so.

Both servers run the default model (SmolLM2-135M-Instruct) as bench.serving starts them;
they are measured alternately, each idle while the other is measured. Prints, per tool and
server, completed and failed requests, requests/s, output tokens/s and median time to first
token (TTFT), with ebb's ratios to vLLM's; exits non-zero if any request failed. Results go
to bench/results/serving_tools.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

# bench.serving puts tests/ on the path and brings its helpers along.
from bench.serving import (
    REPO,
    TEST_WEIGHTS_DIR,
    free_port,
    start_ebb,
    start_vllm_server,
    temp_home,
)
from ebb.config import DEFAULT_MODEL_SOURCE
from ebb.weights_cache import ensure

SERVED_NAME = "smol"  # bench.serving's deployment and vLLM's --served-model-name


@dataclass
class Run:
    tool: str
    server: str
    completed: int
    failed: int
    requests_per_s: float
    output_tokens_per_s: float
    median_ttft_ms: float


def vllm_bench_serve(base_url: str, key: str, tokenizer: Path, args: argparse.Namespace) -> Run:
    """`vllm bench serve` with its defaults but for the load's size (the key goes where
    the tool reads one: OPENAI_API_KEY)."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    result_dir = tempfile.mkdtemp(prefix="vllm-bench-")
    parsed = parser.parse_args(
        [
            *("--base-url", base_url, "--model", SERVED_NAME, "--tokenizer", str(tokenizer)),
            *("--dataset-name", "random", "--num-prompts", str(args.requests)),
            *("--random-input-len", str(args.input_tokens)),
            *("--random-output-len", str(args.output_tokens)),
            *("--max-concurrency", str(args.concurrency), "--seed", "0", "--disable-tqdm"),
            *("--result-dir", result_dir),
        ]
    )
    os.environ["OPENAI_API_KEY"] = key
    result = main(parsed)
    return Run(
        "vllm bench serve",
        "",
        result["completed"],
        result["failed"],
        result["request_throughput"],
        result["output_throughput"],
        result["median_ttft_ms"],
    )


def guidellm_run(
    guidellm: str, base_url: str, key: str, tokenizer: Path, args: argparse.Namespace
) -> Run:
    """guidellm's default backend (openai_http: streamed Chat Completions) at a fixed
    concurrency for a fixed number of synthetic requests."""
    out = Path(tempfile.mkdtemp(prefix="guidellm-")) / "report.json"
    backend = f"kind=openai_http,target={base_url},model={SERVED_NAME},api_key={key}"
    data = f"kind=synthetic_text,prompt_tokens={args.input_tokens},"
    data += f"output_tokens={args.output_tokens}"
    subprocess.run(
        [
            guidellm,
            "run",
            *("--backend", backend, "--data", data),
            *("--profile", f"kind=concurrent,streams={args.concurrency}"),
            *("--constraint", f"kind=max_requests,count={args.requests}"),
            *("--tokenizer", f"kind=hf_auto,model={tokenizer}"),
            *("--output", f"kind=json,path={out}", "--disable-console-interactive"),
        ],
        check=True,
        timeout=1800,
    )
    (benchmark,) = json.loads(out.read_text())["benchmarks"]
    metrics = benchmark["metrics"]
    totals = metrics["request_totals"]
    duration_s = benchmark["duration"]
    output_tokens = metrics["output_token_count"]["successful"]["total_sum"]
    return Run(
        "guidellm",
        "",
        totals["successful"],
        totals["errored"] + totals["incomplete"],
        totals["successful"] / duration_s,
        output_tokens / duration_s,
        metrics["time_to_first_token_ms"]["successful"]["median"],
    )


def report(runs: list[Run]) -> None:
    print(
        f"\n{'tool':<18}{'server':<8}{'done':>6}{'failed':>8}{'req/s':>9}{'out tok/s':>11}"
        f"{'TTFT ms':>10}"
    )
    for run in runs:
        print(
            f"{run.tool:<18}{run.server:<8}{run.completed:>6}{run.failed:>8}"
            f"{run.requests_per_s:>9.2f}{run.output_tokens_per_s:>11.1f}{run.median_ttft_ms:>10.0f}"
        )
    for tool in dict.fromkeys(r.tool for r in runs):
        by_server = {r.server: r for r in runs if r.tool == tool}
        ebb, vllm = by_server.get("ebb"), by_server.get("vllm")
        if ebb and vllm:
            print(
                f"{tool}: ebb/vLLM throughput {ebb.requests_per_s / vllm.requests_per_s:.2f}x, "
                f"median TTFT {ebb.median_ttft_ms / vllm.median_ttft_ms:.2f}x"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--input-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--guidellm", default=shutil.which("guidellm"))
    args = parser.parse_args()
    model_dir = ensure(DEFAULT_MODEL_SOURCE, TEST_WEIGHTS_DIR).path
    results = REPO / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    platform = start_ebb(temp_home("ebb-bench-tools-"))
    port = free_port()
    server = start_vllm_server(model_dir, port, results / "serving_tools-vllm.log")
    # vLLM's server, started without --api-key, ignores the key it is sent.
    targets = {
        "vllm": (f"http://127.0.0.1:{port}", "unused"),
        "ebb": (platform.base_url, platform.admin_key),
    }
    runs: list[Run] = []
    try:
        for name, (url, key) in targets.items():
            run = vllm_bench_serve(url, key, model_dir, args)
            runs.append(Run(**{**asdict(run), "server": name}))
        if args.guidellm:
            for name, (url, key) in targets.items():
                run = guidellm_run(args.guidellm, url, key, model_dir, args)
                runs.append(Run(**{**asdict(run), "server": name}))
        else:
            print("guidellm: not found (--guidellm PATH or on PATH); its runs are skipped")
    finally:
        server.terminate()
        server.wait(timeout=60)
        platform.stop()
    report(runs)
    (results / "serving_tools.json").write_text(
        json.dumps({"args": vars(args), "runs": [asdict(r) for r in runs]}, indent=2)
    )
    if any(r.failed for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
