"""Calibrate the latency model's constants on the real engine (vLLM on CPU, the default
model): TTFT against prompt tokens (one request at a time) and TPOT against batch size
(B requests decoding together), each fitted to a line with the model's own fit.

    .venv/bin/python -m bench.latency_calibrate [--reps 2] [--batches 1,2,4,8,16] [--eager]

Prints the fitted constants (`prefill_base_s`, `prefill_per_token_s`, `tpot_base_s`,
`tpot_per_batch_s`) and writes them to bench/results/latency-calibrate-*.json with the
device it ran on (the first GPU, else the CPU), the engine's import and load times
(`starts`, timed in-process) and every sample. `bench.autoscale --runner-file PATH` runs
the simulator on that file (`simulation_runners.from_calibration`); the simulator's
`CALIBRATED` runner model is one such run's numbers (vLLM on this 2-core CPU). Prompts
are random token ids, so the prefix cache does not shorten a prefill. Takes one to two
minutes on two cores (most of it loading the engine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

from ebb.coldstart.latency_model import fit_line
from ebb.queue.schema import SamplingSpec

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support import TEST_WEIGHTS_DIR  # noqa: E402

from ebb.config import DEFAULT_MODEL_SOURCE  # noqa: E402
from ebb.gpus.nvml import NvmlUnavailable, read_devices  # noqa: E402
from ebb.runners.engine import EngineAdapter, EngineOptions  # noqa: E402
from ebb.weights_cache import ensure  # noqa: E402

PROMPTS = (16, 128, 256, 512, 768)
DECODE_TOKENS = 24
_rng = random.Random(0)


def _prompt(n: int) -> list[int]:
    return [_rng.randrange(1000, 40000) for _ in range(n)]


def ttft_s(engine: EngineAdapter, tokens: int, tag: str) -> float:
    """Add-to-first-output of one request alone (max 1 token: its prefill)."""
    sampling = SamplingSpec(max_tokens=1, temperature=0, ignore_eos=True)
    began = time.perf_counter()
    engine.add_request(tag, _prompt(tokens), sampling)
    first = None
    while engine.has_unfinished():
        outs = engine.step()
        if first is None and any(o.choices for o in outs):
            first = time.perf_counter() - began
    return first if first is not None else time.perf_counter() - began


def tpot_s(engine: EngineAdapter, batch: int, tag: str) -> float:
    """Seconds per decode step with `batch` requests in the batch (every one past its
    first token), each step giving each of them one token."""
    sampling = SamplingSpec(max_tokens=DECODE_TOKENS, temperature=0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"{tag}-{i}", _prompt(16), sampling)
    started: set[str] = set()
    while len(started) < batch:
        started |= {o.request_id for o in engine.step() if o.choices}
    steps, began = 0, time.perf_counter()
    while engine.has_unfinished():
        outs = engine.step()
        if outs and all(not o.finished for o in outs):
            steps += 1
        elif outs:
            break
    elapsed = time.perf_counter() - began
    while engine.has_unfinished():
        engine.step()
    return elapsed / max(steps, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--weights-dir", type=Path, default=None)
    parser.add_argument(
        "--eager", action="store_true", help="on a GPU: no CUDA graphs (CPU is always eager)"
    )
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    print(f"results: {run(args.reps, batches, args.weights_dir, eager=args.eager)}")


def run(
    reps: int, batches: list[int], weights_dir: Path | None = None, *, eager: bool = False
) -> Path:
    """Calibrate on this host's engine; the result file's path."""
    weights = weights_dir or TEST_WEIGHTS_DIR
    if not weights.exists() and Path("/work/main/.ebb/test-weights").exists():
        weights = Path("/work/main/.ebb/test-weights")  # a worktree shares main's cache
    model = ensure(DEFAULT_MODEL_SOURCE, weights)
    from ebb.runners.engine_vllm import VllmEngine, preload

    options = EngineOptions(
        model_path=model.path,
        max_model_len=min(model.max_model_len, 1024),
        max_num_seqs=max(batches),
        kv_cache_gib=1,
        enforce_eager=eager or None,
    )
    # The engine's import and load, as a stem (imported) and a fresh runner (both) pay.
    began = time.perf_counter()
    preload()
    imported = time.perf_counter()
    engine = VllmEngine.load(options)
    starts = {
        "engine_import_s": round(imported - began, 3),
        "engine_load_s": round(time.perf_counter() - imported, 3),
    }
    try:
        ttft_s(engine, 16, "warm")
        prefill = [(n, ttft_s(engine, n, f"p{n}-{r}")) for r in range(reps) for n in PROMPTS]
        decode = [(b, tpot_s(engine, b, f"b{b}-{r}")) for r in range(reps) for b in batches]
    finally:
        engine.shutdown()
    for n, s in prefill:
        print(f"prompt {n:>4} tokens: ttft {s * 1000:7.1f} ms")
    for b, s in decode:
        print(f"batch {b:>3}: tpot {s * 1000:7.1f} ms")
    result = calibration(prefill, decode, starts, device_name() + (", eager" if eager else ""))
    print("fitted:", json.dumps(result["constants"]), "on", result["device"])
    print("starts:", json.dumps(starts))
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"latency-calibrate-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=1))
    return path


def device_name() -> str:
    """The GPU the engine ran on (vLLM takes the first visible), else this host's CPU."""
    try:
        devices = read_devices()
    except NvmlUnavailable:
        devices = []
    if devices:
        return f"cuda: {devices[0].name} ({devices[0].total_bytes / 1024**3:.0f} GiB)"
    return f"cpu: {platform.machine()}, {os.cpu_count()} cores"


def calibration(
    prefill: list[tuple[int, float]],
    decode: list[tuple[int, float]],
    starts: dict[str, float] | None,
    device: str,
) -> dict[str, Any]:
    """What the result file holds: the fitted lines (the runner model's constants,
    `simulation_runners.from_calibration`), the start times, the device and every sample."""
    p = fit_line([(float(n), s) for n, s in prefill], min_samples=2)
    d = fit_line([(float(b), s) for b, s in decode], min_samples=2)
    if p is None or d is None:
        raise ValueError("too few samples to fit a line (two prompt lengths, two batch sizes)")
    constants = {
        "prefill_base_s": round(p.intercept, 4),
        "prefill_per_token_s": round(p.slope, 7),
        "tpot_base_s": round(d.intercept, 4),
        "tpot_per_batch_s": round(d.slope, 5),
    }
    return {
        "constants": constants,
        "starts": starts,
        "device": device,
        "prefill": prefill,
        "decode": decode,
    }


if __name__ == "__main__":
    main()
