"""LoRA adapters on one warm base, on the real engine (vLLM, the default model), one run:

    .venv/bin/python -m bench.lora [--adapters 100] [--distinct 8] [--rounds 8]

1. First-request TTFT of an adapter on a warm base (fetched and checked through the
   weight cache, loaded by the engine) vs the same adapter warm: p50/p95 over `--rounds`
   adapters, and their ratio.
2. Base throughput (output tokens/s, a batch of 16 greedy requests) with LoRA on vs off:
   the same engine options but `lora`, loaded one after the other.
3. `--adapters` adapters registered, `--distinct` distinct ones in one batch (max_loras =
   distinct): the batch's tokens/s, and resident memory per loaded adapter (the process's
   RSS growth over loading them, divided by their count).

Runs the engine in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, as runners do). On
CPU the absolute figures are this machine's; compare the ratios.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.serving import REPO

sys.path.insert(0, str(REPO / "tests"))

from support import TEST_WEIGHTS_DIR  # noqa: E402
from support.lora import peft_adapters  # noqa: E402

from ebb.config import DEFAULT_MODEL_SOURCE  # noqa: E402
from ebb.engine_options import LoraLimits  # noqa: E402
from ebb.queue.schema import AdapterRef, SamplingSpec, WorkItem  # noqa: E402
from ebb.runners.adapters import RunnerAdapters  # noqa: E402
from ebb.runners.engine import EngineOptions, LoraAdapter  # noqa: E402
from ebb.weights_cache import ensure  # noqa: E402

QUESTION = "What is the capital of France?"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def load(model, lora: LoraLimits | None):
    from ebb.runners.engine_vllm import VllmEngine

    options = EngineOptions(
        model_path=model.path, max_model_len=1024, max_num_seqs=32, kv_cache_gib=1, lora=lora
    )
    return VllmEngine.load(options)


def ttft_s(engine, prompt: list[int], lora: LoraAdapter | None, started: float) -> float:
    engine.add_request(f"t{started}", prompt, SamplingSpec(max_tokens=1, temperature=0), lora=lora)
    first = None
    while engine.has_unfinished():
        for _ in engine.step():
            first = first or time.perf_counter()
    return (first or time.perf_counter()) - started


def tokens_per_s(engine, prompt: list[int], loras: list[LoraAdapter | None], n: int = 16) -> float:
    sampling = SamplingSpec(max_tokens=32, temperature=0, ignore_eos=True)
    started = time.perf_counter()
    for i in range(n):
        engine.add_request(f"b{started}-{i}", prompt, sampling, lora=loras[i % len(loras)])
    tokens = 0
    while engine.has_unfinished():
        for output in engine.step():
            tokens += sum(c.token_count for c in output.choices)
    return tokens / (time.perf_counter() - started)


def registered(root: Path, source: Path, count: int) -> list[AdapterRef]:
    refs = []
    for i in range(count):
        target = root / f"a{i}"
        shutil.copytree(source, target)
        refs.append(AdapterRef(name=f"a{i}", uid=f"dep_a{i}", source=str(target)))
    return refs


def work(ref: AdapterRef) -> WorkItem:
    sampling = SamplingSpec(max_tokens=1)
    return WorkItem(
        request_id=ref.name, deployment="b", prompt_token_ids=[], sampling=sampling, adapter=ref
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--adapters", type=int, default=100)
    parser.add_argument("--distinct", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    model = ensure(DEFAULT_MODEL_SOURCE, TEST_WEIGHTS_DIR)
    root = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    made = peft_adapters(model.path, root, QUESTION)
    prompt = made["prompt"]
    refs = registered(root / "many", root / "random", args.adapters)
    limits = LoraLimits(args.distinct, 16, max(args.distinct, args.adapters))

    off = load(model, None)
    ttft_s(off, prompt, None, time.perf_counter())  # warm-up
    base_off = tokens_per_s(off, prompt, [None])
    off.shutdown()
    del off

    engine = load(model, limits)
    adapters = RunnerAdapters(root / "cache", limits=limits, base_source=str(model.path))
    ttft_s(engine, prompt, None, time.perf_counter())  # warm-up
    base_on = tokens_per_s(engine, prompt, [None])
    cold, warm = [], []
    for ref in refs[: args.rounds]:
        started = time.perf_counter()
        cold.append(ttft_s(engine, prompt, adapters.for_work(work(ref)), started))
        started = time.perf_counter()
        warm.append(ttft_s(engine, prompt, adapters.for_work(work(ref)), started))
    rss_before = psutil.Process().memory_info().rss
    batch = [
        adapters.for_work(work(ref)) for ref in refs[args.rounds : args.rounds + args.distinct]
    ]
    mixed = tokens_per_s(engine, prompt, list(batch), n=2 * args.distinct)
    per_adapter = (psutil.Process().memory_info().rss - rss_before) / max(1, len(batch))
    engine.shutdown()
    shutil.rmtree(root, ignore_errors=True)

    ms = 1000
    print(
        f"adapter TTFT cold  p50 {statistics.median(cold) * ms:.1f} ms  p95 "
        f"{percentile(cold, 0.95) * ms:.1f} ms"
    )
    print(
        f"adapter TTFT warm  p50 {statistics.median(warm) * ms:.1f} ms  p95 "
        f"{percentile(warm, 0.95) * ms:.1f} ms"
    )
    print(
        f"cold - warm p95 {(percentile(cold, 0.95) - percentile(warm, 0.95)) * ms:+.1f} ms, "
        f"ratio p50 {statistics.median(cold) / statistics.median(warm):.2f}x"
    )
    print(
        f"base throughput LoRA off {base_off:.1f} tok/s, on {base_on:.1f} tok/s, "
        f"ratio {base_on / base_off:.2f}x"
    )
    print(
        f"{args.adapters} adapters registered, {len(batch)} distinct in one batch: "
        f"{mixed:.1f} tok/s; resident memory per loaded adapter {per_adapter / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    main()
