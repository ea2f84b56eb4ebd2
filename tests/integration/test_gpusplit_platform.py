"""Where a runner's GPU-seconds went, through the whole platform (fake engine): each use
(serving, loading, idle, asleep, wasted) shows up, and the uses add up to the metered
GPU time exactly, per runner, in `GET /v1/usage`'s gpu_costs and in reconcile."""

from __future__ import annotations

import os
import signal
import threading

import httpx
import pytest
from support import Platform, temp_home, wait_until
from support.billing import deploy, gpu_segments, run_cli
from support.metrics import scrape

from ebb.billing.entries import gpu_uses
from ebb.queue import keys

pytestmark = pytest.mark.integration

USES = ("serving", "loading", "idle", "asleep", "wasted")


@pytest.fixture(scope="module")
def platform():
    # Runners write their GPU time every second, so a live one's shows up at once.
    env = {"EBB_GPU_METER_INTERVAL_S": "1"}
    p = Platform(home=temp_home("ebb-it-gpusplit-"), redis_url=None, env_extra=env).start()
    yield p
    assert p.stop() == 0


def runners(admin: httpx.Client, name: str) -> list[dict]:
    return admin.get(f"/v1/deployments/{name}").json()["runners"]


def closed_runner(admin, platform_redis, runner_id: str) -> int:
    """Wait for the runner's metering to close; its metered milliseconds, launch to end."""
    key = keys.runner(runner_id)
    wait_until(lambda: platform_redis.hget(key, "meter_closed") == b"1", 60, "its close")
    pieces = gpu_segments(platform_redis, runner_id)
    assert all(a.end_ms == b.start_ms for a, b in zip(pieces, pieces[1:], strict=False))
    return sum(p.duration_ms for p in pieces)


def split_of(platform_redis, runner_id: str) -> dict[str, int]:
    """The runner's GPU ms by use, booked as the ledger books them."""
    total = dict.fromkeys(USES, 0)
    for piece in gpu_segments(platform_redis, runner_id):
        for use in USES:
            total[use] += gpu_uses(piece.duration_ms, piece.uses_ms)[f"gpu_{use}_ms"]
    return total


def cost_row(admin, tenant: str | None, deployment: str, gpu_ms: int) -> dict:
    def row():
        params = {"tenant": tenant} if tenant else {}
        rows = admin.get("/v1/usage", params=params).json()["gpu_costs"]
        found = [r for r in rows if r["deployment"] == deployment]
        return found and found[0]["gpu_ms"] == gpu_ms and found[0]

    return wait_until(row, 30, f"{deployment}'s GPU time in the usage report")


def test_a_runners_life_books_loading_serving_idle_and_asleep_exactly(
    platform, admin, platform_redis
):
    deploy(
        admin,
        "gs-life",
        "fake://gs?load_s=1&step_ms=20&sleep=1",
        idle_timeout_s=1,
        owner="split-t",
    )
    body = {"model": "gs-life", "prompt": "Hi", "max_tokens": 40}
    assert admin.post("/v1/completions", json=body).status_code == 200
    [runner] = wait_until(
        lambda: (rs := runners(admin, "gs-life")) and rs[0]["state"] == "sleeping" and rs,
        60,
        "the runner to fall asleep",
    )
    key = keys.runner(runner["id"])
    asleep_at = int(platform_redis.hget(key, "heartbeat_ms"))
    wait_until(
        lambda: int(platform_redis.hget(key, "heartbeat_ms")) > asleep_at + 1000,
        30,
        "a second asleep",
    )
    assert admin.delete("/v1/deployments/gs-life").status_code in (200, 204)
    metered = closed_runner(admin, platform_redis, runner["id"])
    split = split_of(platform_redis, runner["id"])
    assert sum(split.values()) == metered
    assert all(split[u] > 0 for u in ("serving", "loading", "idle", "asleep")), split
    assert split["wasted"] == 0
    row = cost_row(admin, None, "gs-life", metered)
    assert row["tenant"] == "split-t"  # the owner pays the GPUs; the tokens were admin's
    assert row["gpu_ms_by_use"] == split
    assert row["completion_tokens"] == 40
    assert row["tokens_per_gpu_second"] == round(40 * 1000 / metered, 3)
    shown = run_cli(platform, "usage", "--costs")
    assert shown.returncode == 0, shown.stderr
    assert "wasted" in shown.stdout and "gs-life" in shown.stdout
    checked = admin.get("/v1/usage/reconcile").json()
    assert checked["ok"], checked["drift"]

    def scraped():
        # One frontdoor worker answers a scrape: all of its figures come from its streams.
        s = scrape(admin)
        gpu_s = s.value("ebb_gpu_seconds_total", deployment="gs-life")
        return gpu_s * 1000 >= metered - 1 and s

    s = wait_until(scraped, 30, "the runner's GPU time on /metrics")
    by_use = {u: s.value("ebb_gpu_use_seconds_total", deployment="gs-life", use=u) for u in USES}
    assert by_use["asleep"] > 0 and by_use["serving"] > 0
    assert sum(by_use.values()) == pytest.approx(
        s.value("ebb_gpu_seconds_total", deployment="gs-life")
    )
    assert s.value("ebb_tokens_per_gpu_second", deployment="gs-life") > 0


def test_a_cold_start_refused_before_it_served_is_wasted_whole(platform, admin, platform_redis):
    # The request gives up (503) while the runner it woke still loads; the runner then
    # idles past its timeout and drains, having served nothing.
    deploy(admin, "gs-late", "fake://gl?load_s=3", idle_timeout_s=1, admission_timeout_s=1)
    body = {"model": "gs-late", "prompt": "Hi", "max_tokens": 4}
    assert admin.post("/v1/completions", json=body).status_code == 503
    [runner] = wait_until(lambda: runners(admin, "gs-late"), 30, "the runner it woke")
    metered = closed_runner(admin, platform_redis, runner["id"])
    split = split_of(platform_redis, runner["id"])
    assert split == {**dict.fromkeys(USES, 0), "wasted": metered}
    row = cost_row(admin, "admin", "gs-late", metered)
    assert row["gpu_ms_by_use"]["wasted"] == metered and row["share_by_use"]["wasted"] == 1.0


def test_a_min_replicas_runner_is_kept_capacity_not_waste(platform, admin, platform_redis):
    deploy(admin, "gs-kept", "fake://gm?load_s=1", idle_timeout_s=1, min_replicas=1)
    [runner] = wait_until(
        lambda: (rs := runners(admin, "gs-kept")) and rs[0]["state"] == "ready" and rs,
        60,
        "its min_replicas runner",
    )
    # Its time reaches the ledger while it lives, though it has served nothing.
    wait_until(lambda: gpu_segments(platform_redis, runner["id"]), 60, "a segment of it")
    assert admin.delete("/v1/deployments/gs-kept").status_code in (200, 204)
    metered = closed_runner(admin, platform_redis, runner["id"])
    split = split_of(platform_redis, runner["id"])
    assert sum(split.values()) == metered
    assert split["wasted"] == 0 and split["loading"] > 0 and split["idle"] > 0, split


def test_the_time_lost_with_a_killed_runner_is_wasted(platform, admin, platform_redis):
    deploy(admin, "gs-kill", "fake://gk?step_ms=50", idle_timeout_s=1)
    body = {"model": "gs-kill", "prompt": "Hi", "max_tokens": 200, "stream": True}
    first_chunk = threading.Event()

    def stream() -> None:
        with admin.stream("POST", "/v1/completions", json=body) as reply:
            for _ in reply.iter_lines():
                first_chunk.set()

    client = threading.Thread(target=stream, daemon=True)
    client.start()
    wait_until(first_chunk.is_set, 60, "the stream to start")
    [runner] = runners(admin, "gs-kill")
    os.kill(runner["pid"], signal.SIGKILL)
    metered = closed_runner(admin, platform_redis, runner["id"])
    split = split_of(platform_redis, runner["id"])
    assert sum(split.values()) == metered
    assert split["wasted"] > 0, split
    client.join(120)
    # The stream went on on another runner, which replayed the lost runner's output: its
    # prefill of that output is wasted too.
    [heir] = wait_until(
        lambda: [r for r in runners(admin, "gs-kill") if r["id"] != runner["id"]],
        60,
        "the runner that continued the stream",
    )
    heir_metered = closed_runner(admin, platform_redis, heir["id"])
    heir_split = split_of(platform_redis, heir["id"])
    assert sum(heir_split.values()) == heir_metered
    assert heir_split["serving"] > 0 and heir_split["wasted"] > 0, heir_split
    checked = admin.get("/v1/usage/reconcile").json()
    assert checked["ok"], checked["drift"]
