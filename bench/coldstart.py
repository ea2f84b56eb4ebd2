"""Cold-start benchmark: a request at a deployment with zero runners, to its first token.

    .venv/bin/python -m bench.coldstart [--skip-fetch]

Tiers measured through ebb, each on a platform of its own so that no background work
(a refilling pool) competes for the cores:
  at_ready     as `make run`: `ebb up` with the default model deployed, and its first
               request sent the moment `ready:` is printed (seen within 0.2 s)
  prewarmed    a pre-warmed stem (engine imported) loads the cached model
  forked       a runner forked from the fork server (engine imported) loads it
  fresh        a new process imports the engine and loads the cached model
  fresh_fetch  as fresh, with an empty weight cache (the GGUF is converted first)
Baseline, same run: starting vLLM's own OpenAI server (eager) on the same model directory
and sending the same request as soon as it answers. Prints each tier's time to first token,
its ratio to the baseline and the phase breakdown the runner reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx

from bench.loadgen import chat_body, stream_one
from bench.serving import KV_CACHE_GIB, MAX_MODEL_LEN, REPO, start_vllm_server

sys.path.insert(0, str(REPO / "tests"))

from support import (  # noqa: E402
    TEST_WEIGHTS_DIR,
    Platform,
    free_port,
    temp_home,
    wait_for_weights,
)

from ebb.config import DEFAULT_MODEL_NAME, DEFAULT_MODEL_SOURCE  # noqa: E402
from ebb.weights_cache import ensure  # noqa: E402


def request_timing(base_url: str, key: str, model: str) -> tuple[float, float]:
    """Send the benchmark request; (perf_counter when it was sent, when its first token came).

    The client is built before the clock starts, and the first token is the first content
    delta, not the end of the stream, so neither the client's set-up nor the decoding of
    the rest of the answer is counted.
    """

    async def once() -> tuple[float, float]:
        async with httpx.AsyncClient(
            headers={"Authorization": f"Bearer {key}"}, timeout=600
        ) as client:
            sent = time.perf_counter()
            sample = await stream_one(
                client, base_url + "/chat/completions", chat_body(model, 0, 16)
            )
            return sent, sent + sample.ttft_s

    return asyncio.run(once())


def read_into_page_cache(model_dir: Path) -> None:
    """Read every file of the model once, so that each contender loads it from memory.

    Whether the weights are still in the page cache depends on what ran before (a test
    suite evicts them); cold, reading them costs ~0.5 s more here, to whoever comes first.
    """
    for path in sorted(model_dir.rglob("*")):
        if path.is_file():
            with path.open("rb") as f:
                while f.read(1 << 24):
                    pass


def baseline_s(model_dir: Path, work: Path, *, gpu: bool = False) -> float:
    """Server start plus the same request: from the server's spawn to the first token."""
    read_into_page_cache(model_dir)
    start = time.perf_counter()
    port = free_port()
    server = start_vllm_server(model_dir, port, work / "vllm-server.log", gpu=gpu)
    try:
        _, first_token = request_timing(f"http://127.0.0.1:{port}/v1", "none", "smol")
        return first_token - start
    finally:
        server.terminate()
        server.wait(timeout=60)


def ebb_tier(tier: str, work: Path, model_dir: Path, deploy_extra: dict | None = None) -> dict:
    """One tier's cold start to first token; `deploy_extra`: more deployment fields."""
    weights = TEST_WEIGHTS_DIR if tier != "fresh_fetch" else work / f"{tier}-weights"
    platform = Platform(home=work / tier, redis_url=None, env_extra=_tier_env(tier, weights)).start(
        timeout_s=600
    )
    if tier == "forked":
        platform.wait_for_fork_server()
    try:
        with platform.admin() as admin:
            deploy_started = time.perf_counter()
            created = admin.post(
                "/v1/deployments",
                json={
                    "name": "smol",
                    "source": DEFAULT_MODEL_SOURCE,
                    "max_model_len": MAX_MODEL_LEN,
                    "admission_timeout_s": 600,
                    "idle_timeout_s": 600,
                    **(deploy_extra or {}),
                },
            )
            created.raise_for_status()
            if tier != "fresh_fetch":
                # The deploy's own prefetch is a cache hit; wait for it so that only the
                # request's cold start is timed.
                wait_for_weights(admin, "smol", 120)
                read_into_page_cache(model_dir)
            sent, first_token = request_timing(
                platform.base_url + "/v1", platform.admin_key, "smol"
            )
            # The fetching tier counts from the deploy: its request waits on the fetch.
            total = first_token - (deploy_started if tier == "fresh_fetch" else sent)
            view = admin.get("/v1/deployments/smol").json()
        return _tier_result(tier, total, view)
    finally:
        platform.stop()


def _tier_env(tier: str, weights: Path) -> dict[str, str]:
    return {
        "EBB_PREWARM": "1" if tier == "prewarmed" else "0",
        # As `ebb up` runs by default, but for the tiers that start without it.
        "EBB_FORK_SERVER": "1" if tier in ("prewarmed", "forked") else "0",
        "EBB_WEIGHTS_CACHE_DIR": str(weights),
        "EBB_KV_CACHE_GIB": KV_CACHE_GIB,
    }


def _tier_result(tier: str, first_token_s: float, view: dict) -> dict:
    """One row: the time to first token, the tiers the deployment's runners came up
    through and their phases (`view`: the deployment as the API shows it)."""
    return {
        "tier": tier,
        "first_token_s": round(first_token_s, 2),
        "runner_tiers": [r["tier"] for r in view["runners"]],
        "phases_ms": view["cold_start_ms"],
    }


def at_ready(work: Path, model_dir: Path) -> dict:
    """`make run`'s platform, and a request the moment it says `ready:`: the time to its
    first token, counted from when it was sent."""
    read_into_page_cache(model_dir)  # as for every contender, before the clock starts
    platform = Platform(
        home=work / "at_ready",
        redis_url=None,
        default_model=True,
        env_extra=_tier_env("prewarmed", TEST_WEIGHTS_DIR),  # as `ebb up` runs by default
    ).start(timeout_s=600)
    try:
        sent, first_token = request_timing(
            platform.base_url + "/v1", platform.admin_key, DEFAULT_MODEL_NAME
        )
        with platform.admin() as admin:
            view = admin.get(f"/v1/deployments/{DEFAULT_MODEL_NAME}").json()
        return _tier_result("at_ready", first_token - sent, view)
    finally:
        platform.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-fetch", action="store_true", help="skip the fresh_fetch tier")
    args = parser.parse_args()
    model = ensure(DEFAULT_MODEL_SOURCE, TEST_WEIGHTS_DIR)
    work = temp_home("ebb-coldstart-")
    tiers = ["prewarmed", "forked", "fresh"] + ([] if args.skip_fetch else ["fresh_fetch"])
    results = [at_ready(work, model.path)] + [ebb_tier(tier, work, model.path) for tier in tiers]
    base = baseline_s(model.path, work)
    print(f"baseline: vLLM OpenAI server start + first token = {base:.2f} s")
    for r in results:
        r["ratio_to_baseline"] = round(r["first_token_s"] / base, 3)
        phases = {t: {p: round(ms) for p, ms in ph.items()} for t, ph in r["phases_ms"].items()}
        print(
            f"{r['tier']:>12}: {r['first_token_s']:6.2f} s  ratio {r['ratio_to_baseline']:.3f}"
            f"  via {r['runner_tiers']}  phases {phases}"
        )
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"coldstart-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"baseline_s": round(base, 2), "tiers": results}, indent=2))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
