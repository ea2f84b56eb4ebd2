"""GPU check: ebb's cold-start tiers, packing and forked CUDA on one GPU host, in one run;
optionally issue 39's GPU-only measurements.

    .venv/bin/python -m bench.gpu_check [--no-tiers] [--calibrate] [--step]

Needs nothing beyond `make install` on a host with an NVIDIA GPU; on a host without one
it says so and exits 0. Sections, in order:
  1. baseline: vLLM's own OpenAI server started on the default model, to its first token;
  2. the prewarmed, forked and fresh tiers through ebb (`bench.coldstart`), each on a
     platform of its own, as ratios to the baseline;
  3. on one platform with the fork server: a forked runner that must come up on CUDA;
     left idle it sleeps (vLLM sleep level 1), and the next request's wake to first token
     is the sleeping tier; a second deployment is then packed onto the same GPU and both
     answer.
  (1-3 take about 8 minutes; `--no-tiers` skips them.)
  4. `--calibrate`: the latency model's constants fitted on this GPU
     (`bench.latency_calibrate`, batches up to 64), then the simulator on that file
     (`bench.autoscale --runner-file`, the TTFT- and TPOT-target rows against Knative's
     60 s window; about 3 minutes, half of it CPU work: the full table can be run later,
     anywhere, from the file);
  5. `--step`: `bench.step_load` on the real engine: 16 streams, then 48 (of 64 slots), on
     a p90 TPOT target 1.3x the 1x p90: the time to the scale-out decision, the new runner
     ready and the p90 back under the target (about 4 minutes).
Every engine runs eager (no CUDA graph capture) to keep within the budget. Prints a
summary and writes it to bench/results/ (with each section's own result file).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench import autoscale, latency_calibrate, step_load
from bench.coldstart import baseline_s, ebb_tier, read_into_page_cache, request_timing
from bench.serving import MAX_MODEL_LEN, REPO

sys.path.insert(0, str(REPO / "tests"))

from support import (  # noqa: E402
    TEST_WEIGHTS_DIR,
    Platform,
    temp_home,
    wait_for_weights,
    wait_until,
)

from ebb.config import DEFAULT_MODEL_SOURCE  # noqa: E402
from ebb.gpus.nvml import NvmlUnavailable, read_devices  # noqa: E402

# Eager on both sides: CUDA graph capture would take most of the budget, on both alike.
ENGINE = {"enforce_eager": True}
TIERS = ("prewarmed", "forked", "fresh")


def gpu_names() -> list[str] | str:
    """This host's GPUs, or why there are none."""
    try:
        devices = read_devices()
    except NvmlUnavailable as e:
        return str(e)
    return [f"{d.index}: {d.name} ({d.total_bytes / 1024**3:.0f} GiB)" for d in devices] or (
        "NVML reports no GPU"
    )


def deploy(admin, name: str, **fields) -> None:
    body = {
        "name": name,
        "source": DEFAULT_MODEL_SOURCE,
        "max_model_len": MAX_MODEL_LEN,
        "admission_timeout_s": 600,
        "engine": ENGINE,
        **fields,
    }
    admin.post("/v1/deployments", json=body).raise_for_status()
    wait_for_weights(admin, name, 120)


def runners_of(admin, name: str) -> list[dict]:
    return admin.get(f"/v1/deployments/{name}").json()["runners"]


def placements(admin) -> dict[str, list[int]]:
    return {r["id"]: r["gpus"] for r in admin.get("/v1/status").json()["runners"]}


def loaded_on_cuda(platform: Platform, runner_id: str) -> bool:
    """The runner's own log says its engine loaded on CUDA (engine_vllm's load line)."""
    log = platform.home / "logs" / f"runner-{runner_id}.log"
    return any(
        "engine: loaded" in line and " on cuda " in line
        for line in log.read_text(errors="replace").splitlines()
    )


def forked_sleeping_packed(work: Path, model_dir: Path) -> dict:
    platform = Platform(
        home=work / "gpu-check",
        redis_url=None,
        env_extra={"EBB_FORK_SERVER": "1", "EBB_WEIGHTS_CACHE_DIR": str(TEST_WEIGHTS_DIR)},
    ).start(timeout_s=600)
    platform.wait_for_fork_server()
    try:
        with platform.admin() as admin:
            # A short idle timeout: the runner goes to sleep soon after its first answer.
            deploy(admin, "a", idle_timeout_s=5)
            read_into_page_cache(model_dir)
            request_timing(platform.base_url + "/v1", platform.admin_key, "a")
            [first] = runners_of(admin, "a")
            forked_on_cuda = first["tier"] == "forked" and loaded_on_cuda(platform, first["id"])
            wait_until(lambda: runners_of(admin, "a")[0]["state"] == "sleeping", 120, "a to sleep")
            sent, first_token = request_timing(platform.base_url + "/v1", platform.admin_key, "a")
            deploy(admin, "b", min_replicas=1, idle_timeout_s=600)
            wait_until(
                lambda: any(r["state"] == "ready" for r in runners_of(admin, "b")), 300, "b ready"
            )
            request_timing(platform.base_url + "/v1", platform.admin_key, "b")
            request_timing(platform.base_url + "/v1", platform.admin_key, "a")
            where = placements(admin)
            a_gpus = [where.get(r["id"]) for r in runners_of(admin, "a") if r["id"] in where]
            b_gpus = [where.get(r["id"]) for r in runners_of(admin, "b") if r["id"] in where]
            view = admin.get("/v1/deployments/a").json()
        return {
            "forked_runner_on_cuda": forked_on_cuda,
            "sleeping_first_token_s": round(first_token - sent, 3),
            "sleeping_phases_ms": view["cold_start_ms"].get("sleeping", {}),
            "packed_on_one_gpu": bool(a_gpus and b_gpus and a_gpus[0] == b_gpus[0]),
            "gpus": {"a": a_gpus, "b": b_gpus},
        }
    finally:
        platform.stop()


# The simulator rows issue 39's TTFT and TPOT targets are judged on (always on is added).
CALIBRATED_ROWS = "knative 60s,slo ttft 2s,slo+model,slo tpot,tpot+model"
# The step on a GPU: enough streams that the batch, not the per-step overhead, sets TPOT.
STEP_ARGS = (
    "--engine real --eager --concurrency 16 --max-concurrency 64 --max-replicas 2 "
    "--calibrate-s 20 --base-s 20 --step-s 90 --window-s 15"
)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--no-tiers", action="store_true", help="skip sections 1-3")
    parser.add_argument("--calibrate", action="store_true", help="section 4")
    parser.add_argument("--step", action="store_true", help="section 5")
    return parser.parse_args(argv)


def tiers_section() -> tuple[dict[str, Any], bool]:
    """Sections 1-3: what they measured, and whether the forked and packed checks held."""
    from ebb.weights_cache import ensure

    model = ensure(DEFAULT_MODEL_SOURCE, TEST_WEIGHTS_DIR)
    work = temp_home("ebb-gpu-check-")
    base = baseline_s(model.path, work, gpu=True)
    print(f"baseline: vLLM OpenAI server start + first token = {base:.2f} s")
    tiers = [ebb_tier(t, work, model.path, {"engine": ENGINE}) for t in TIERS]
    for r in tiers:
        r["ratio_to_baseline"] = round(r["first_token_s"] / base, 3)
        print(f"{r['tier']:>10}: {r['first_token_s']:6.2f} s  ratio {r['ratio_to_baseline']:.3f}")
    rest = forked_sleeping_packed(work, model.path)
    print(
        f"  sleeping: {rest['sleeping_first_token_s']:6.2f} s  ratio "
        f"{rest['sleeping_first_token_s'] / base:.3f}  phases {rest['sleeping_phases_ms']}"
    )
    print(f"forked runner initialised CUDA: {rest['forked_runner_on_cuda']}")
    packed = rest["packed_on_one_gpu"]
    print(f"two deployments packed on one GPU, both answered: {packed} {rest['gpus']}")
    ok = rest["forked_runner_on_cuda"] and rest["packed_on_one_gpu"]
    return {"baseline_s": base, "tiers": tiers, **rest}, ok


def calibrate_section() -> dict[str, str]:
    """Section 4: the calibration file and the simulator's results on it."""
    calibration = latency_calibrate.run(2, [1, 4, 16, 32, 64], eager=True)
    print(f"calibration: {calibration}")
    table = autoscale.main(["--runner-file", str(calibration), "--rows", CALIBRATED_ROWS])
    print(f"the full table later: python -m bench.autoscale --runner-file {calibration}")
    return {"calibration": str(calibration), "autoscale": str(table)}


def step_section() -> dict[str, Any]:
    """Section 5: the step bench's figures (its timeline stays in its own file)."""
    result = step_load.main(STEP_ARGS.split())
    return {k: v for k, v in result.items() if k not in ("timeline", "scale_outs")}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    gpus = gpu_names()
    if isinstance(gpus, str):
        print(f"gpu_check: no GPU on this host ({gpus}); nothing measured.")
        return 0
    print(f"gpu_check: GPUs {gpus}")
    started = time.perf_counter()
    summary: dict[str, Any] = {"gpus": gpus}
    ok = True
    if not args.no_tiers:
        measured, ok = tiers_section()
        summary |= measured
    if args.calibrate:
        summary["calibrate"] = calibrate_section()
    if args.step:
        summary["step"] = step_section()
    print(f"gpu_check took {time.perf_counter() - started:.0f} s")
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu-check-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(summary, indent=2))
    print(f"results: {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
