"""A step from 1x to 3x load on one deployment with a p90 TPOT target (`scaling.policy
slo`): how long until the controller scales out, the new runner is ready, and the p90
TPOT is back under its target.

    .venv/bin/python -m bench.step_load [--engine real|fake] [--concurrency 4]
        [--calibrate-s 30] [--base-s 30] [--step-s 120] [--tpot-target-s T | --factor 1.3]
        [--window-s 20] [--max-concurrency 16] [--max-replicas 2] [--max-tokens 32] [--eager]

Starts the platform (`ebb up`) and deploys the default model (`--engine fake`: a fake
model whose step takes `FAKE_SOURCE`'s 20 ms + 3 ms per request in the batch, for a CPU
smoke run) with one runner, 16 slots and no target. Phases, each a closed loop of
`--concurrency` streams (1x):
  calibrate  1x for `--calibrate-s`: its p90 TPOT, times `--factor`, is the target T
             (unless `--tpot-target-s`), set with PATCH `scaling: {policy: slo, slo:
             {tpot_p90_s: T, window_s: W}}`;
  1x         `--base-s` more under the target;
  3x         three times the streams for `--step-s` (by default 12 of 16 slots: the
             policy's busy-slot share, 50 %, is met, and nothing queues, so the queue
             rule adds nobody: a scale-out is the target's).
Reports, from the step: the first scale-out decision (the controller's `Scaled` line in
`ebb logs DEPLOYMENT`, with its reason), the new runner ready (polled), and p90 TPOT
over a sliding window of the last W seconds of finished requests (client-measured)
first above T, then back at or under T once the new runner is ready — or that it never
came back within the run. Writes bench/results/step-load-*.json.

On a 2-core CPU the new runner shares the first one's cores: TPOT is not expected to
come back there; the target is a GPU's (bench.gpu_check runs this with `--engine real`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.loadgen import chat_body, save_results, stream_one
from bench.serving import KV_CACHE_GIB, MAX_MODEL_LEN
from bench.step_report import Finished, report

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support import TEST_WEIGHTS_DIR, Platform, temp_home, wait_until  # noqa: E402

from ebb.config import DEFAULT_MODEL_SOURCE  # noqa: E402

NAME = "step"
FAKE_SOURCE = "fake://step?step_ms=20&step_ms_per_seq=3"


@dataclass(frozen=True)
class StepConfig:
    engine: str = "real"
    concurrency: int = 4
    calibrate_s: float = 30.0
    base_s: float = 30.0
    step_s: float = 120.0
    tpot_target_s: float | None = None
    factor: float = 1.3
    window_s: float = 20.0
    max_concurrency: int = 16
    max_replicas: int = 2
    max_tokens: int = 32
    # On a GPU: the runners without CUDA graphs (a shorter start; CPU is always eager).
    eager: bool = False


def start_platform(config: StepConfig) -> Platform:
    """`ebb up` with the deployment's one runner ready."""
    env = {"EBB_WEIGHTS_CACHE_DIR": str(TEST_WEIGHTS_DIR), "EBB_KV_CACHE_GIB": KV_CACHE_GIB}
    if config.engine == "fake":
        env["EBB_TEST_ENGINES"] = "1"
    platform = Platform(home=temp_home("ebb-step-"), redis_url=None, env_extra=env)
    platform.start(timeout_s=600)
    body: dict[str, Any] = {
        "name": NAME,
        "source": FAKE_SOURCE if config.engine == "fake" else DEFAULT_MODEL_SOURCE,
        "min_replicas": 1,
        "max_replicas": config.max_replicas,
        "max_concurrency": config.max_concurrency,
        "idle_timeout_s": 3600,
    }
    if config.engine == "real":
        body["max_model_len"] = MAX_MODEL_LEN
    if config.eager:
        body["engine"] = {"enforce_eager": True}
    try:
        with platform.admin() as admin:
            admin.post("/v1/deployments", json=body).raise_for_status()
            wait_until(lambda: ready_runners(admin) >= 1, 600, "the first runner", poll_s=0.5)
    except BaseException:
        platform.stop()
        raise
    return platform


def ready_runners(admin: httpx.Client) -> int:
    runners = admin.get(f"/v1/deployments/{NAME}").json()["runners"]
    return sum(r["state"] == "ready" for r in runners)


class ReadyWatch(threading.Thread):
    """Polls the deployment's ready runners: (wall time, count) at each change."""

    def __init__(self, platform: Platform):
        super().__init__(daemon=True)
        self._platform = platform
        self.changes: list[tuple[float, int]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        with self._platform.admin() as admin:
            while not self.stopped.wait(0.25):
                count = ready_runners(admin)
                if not self.changes or self.changes[-1][1] != count:
                    self.changes.append((time.time(), count))


class Driver:
    """Closed-loop streams at a level that can rise: each stream sends its next request
    as soon as its last one ends, until stopped."""

    def __init__(self, client: httpx.AsyncClient, url: str, max_tokens: int):
        self._client, self._url, self._max_tokens = client, url, max_tokens
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.finished: list[Finished] = []
        self.errors = 0

    def set_level(self, streams: int) -> None:
        while len(self._tasks) < streams:
            self._tasks.append(asyncio.create_task(self._stream(len(self._tasks))))

    async def stop(self) -> None:
        self._stopping = True
        await asyncio.gather(*self._tasks)

    async def _stream(self, index: int) -> None:
        i = index
        while not self._stopping:
            started = time.time()
            try:
                body = chat_body(NAME, i, self._max_tokens)
                sample = await stream_one(self._client, self._url, body)
            except httpx.HTTPError:
                self.errors += 1
                await asyncio.sleep(0.5)  # a back-off, so a platform down is not spun on
                continue
            tpot = sample.tpot_s
            if tpot is not None:
                self.finished.append(Finished(started, time.time(), sample.ttft_s, tpot))
            i += 1000


async def drive(platform: Platform, config: StepConfig, admin: httpx.Client) -> dict[str, Any]:
    """The three phases; what happened when (wall times) and every finished request."""
    headers = {"Authorization": f"Bearer {platform.admin_key}"}
    limits = httpx.Limits(max_connections=3 * config.concurrency + 4)
    url = platform.base_url + "/v1/chat/completions"
    async with httpx.AsyncClient(headers=headers, timeout=600, limits=limits) as client:
        driver = Driver(client, url, config.max_tokens)
        began = time.time()
        driver.set_level(config.concurrency)
        await asyncio.sleep(config.calibrate_s)
        base = [f.tpot_s for f in driver.finished if f.started_s >= began]
        base_p90 = statistics.quantiles(base, n=10)[-1] if len(base) >= 2 else None
        target = config.tpot_target_s or round(config.factor * (base_p90 or 0.0), 4)
        if not target:
            raise SystemExit("no request finished in the calibrate phase: raise --calibrate-s")
        slo = {"tpot_p90_s": target, "window_s": config.window_s}
        await asyncio.to_thread(set_target, admin, slo)
        await asyncio.sleep(config.base_s)
        step_at = time.time()
        driver.set_level(3 * config.concurrency)
        await asyncio.sleep(config.step_s)
        ended_at = time.time()
        await driver.stop()
    return {
        "began_at": began,
        "step_at": step_at,
        "ended_at": ended_at,
        "base_p90_tpot_s": base_p90,
        "tpot_target_s": target,
        "finished": driver.finished,
        "errors": driver.errors,
    }


def set_target(admin: httpx.Client, slo: dict[str, float]) -> None:
    patch = {"scaling": {"policy": "slo", "slo": slo}}
    admin.patch(f"/v1/deployments/{NAME}", json=patch).raise_for_status()


def run(config: StepConfig) -> dict[str, Any]:
    """Start the platform, run the phases, stop it; the report."""
    platform = start_platform(config)
    watch = ReadyWatch(platform)
    try:
        with platform.admin() as admin:
            watch.start()
            phases = asyncio.run(drive(platform, config, admin))
            watch.stopped.set()
            watch.join()
            logs = admin.get("/v1/logs", params={"deployment": NAME, "tail": 10000}).json()
    finally:
        watch.stopped.set()
        platform.stop()
    lines = [entry["line"] for entry in logs["data"]]
    return {"config": asdict(config)} | report(phases, watch.changes, lines, config.window_s)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    defaults = StepConfig()
    parser.add_argument("--engine", choices=("real", "fake"), default=defaults.engine)
    parser.add_argument("--eager", action="store_true", help="on a GPU: no CUDA graphs")
    for field, value in asdict(defaults).items():
        if field in ("engine", "eager"):
            continue
        kind = float if isinstance(value, float) or value is None else int
        parser.add_argument(f"--{field.replace('_', '-')}", type=kind, default=value)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    result = run(StepConfig(**vars(parse(argv))))
    for line in result["summary"]:
        print(line)
    result["path"] = str(save_results("step-load", result))
    return result


if __name__ == "__main__":
    main()
