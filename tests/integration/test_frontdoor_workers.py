"""EBB_FRONTDOOR_WORKERS: several frontdoor processes serving one port, every platform
process's memory in /v1/status, and a burst at a full queue answered request by request
with the 503 it asks for (never a 500, never a hang)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import psutil
import pytest
from support import Platform, deploy, temp_home, wait_until

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "hi"}]
WORKERS = 2


@pytest.fixture(scope="module")
def platform():
    p = Platform(
        home=temp_home("ebb-it-workers-"),
        redis_url=None,
        env_extra={"EBB_FRONTDOOR_WORKERS": str(WORKERS), "EBB_TEST_ENGINES": "1"},
    ).start()
    yield p
    assert p.stop() == 0


def frontdoor_workers(platform: Platform) -> list[psutil.Process]:
    """The processes serving requests: children of the `ebb frontdoor` supervisor."""
    up = psutil.Process(platform.proc.pid)
    [supervisor] = [c for c in up.children() if "frontdoor" in c.cmdline()]
    # Spawned by multiprocessing (beside its resource tracker, which serves nothing).
    return [c for c in supervisor.children() if "spawn_main" in " ".join(c.cmdline())]


def test_every_worker_serves_and_reports_its_memory(platform):
    with platform.admin() as admin:
        deploy(admin, "w", source="fake://m?step_ms=0", min_replicas=1)
        wait_until(
            lambda: admin.get("/v1/deployments/w").json()["replicas"]["ready"] == 1, 60, "runner"
        )
        body = {"model": "w", "messages": MESSAGES, "max_tokens": 1}
        assert {admin.post("/v1/chat/completions", json=body).status_code for _ in range(8)} == {
            200
        }
        workers = frontdoor_workers(platform)
        assert len(workers) == WORKERS
        pids = {w.pid for w in workers}

        def reported():
            rows = admin.get("/v1/status").json()["processes"]
            roles = {r["role"] for r in rows}
            fronts = {r["pid"] for r in rows if r["role"] == "frontdoor"}
            wanted = {"up", "redis", "coldstart", "webhooks", "billing", "runner"}
            return fronts == pids and wanted <= roles and rows

        rows = wait_until(reported, 30, "every process's memory report")
    for row in rows:
        assert row["rss_bytes"] > 1_000_000, row
        assert row["pss_bytes"] is None or 0 < row["pss_bytes"] <= row["rss_bytes"], row
    [runner] = [r for r in rows if r["role"] == "runner"]
    assert runner["runner_id"].startswith("r")
    shown = platform.cli("status")
    assert shown.returncode == 0, shown.stderr
    table = [line for line in shown.stdout.splitlines() if "frontdoor" in line and "│" in line]
    assert len(table) >= WORKERS and "PSS MiB" in shown.stdout, shown.stdout
    for worker in workers:  # the frontdoor tokenizes without torch (nor transformers on it)
        maps = Path(f"/proc/{worker.pid}/maps").read_text()
        assert "libtorch" not in maps and "/transformers/" not in maps


def test_a_killed_worker_is_replaced_and_the_port_keeps_answering(platform):
    [first, *_] = frontdoor_workers(platform)
    first.kill()
    first.wait(timeout=10)

    def replaced():
        workers = frontdoor_workers(platform)
        return len(workers) == WORKERS and first.pid not in {w.pid for w in workers}

    wait_until(replaced, 60, "uvicorn's supervisor to start another worker")
    with platform.admin() as admin:
        wait_until(lambda: admin.get("/readyz").status_code == 200, 30, "the port to answer")


def test_a_burst_at_a_full_queue_gets_a_503_each(platform):
    with platform.admin() as admin:
        deploy(
            admin,
            "full",
            source="fake://m?load_s=600",
            queue_depth_limit=1,
            admission_timeout_s=600,
        )
    headers = {"Authorization": f"Bearer {platform.admin_key}"}
    body = {"model": "full", "messages": MESSAGES, "max_tokens": 1}

    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(
            base_url=platform.base_url, headers=headers, timeout=120, limits=limits
        ) as client:
            parked = asyncio.ensure_future(client.post("/v1/chat/completions", json=body))
            with platform.admin() as admin:
                await asyncio.to_thread(
                    wait_until,
                    lambda: admin.get("/v1/deployments/full").json()["queue_depth"] == 1,
                    30,
                    "the one queued request",
                )
            answers = await asyncio.gather(
                *(client.post("/v1/chat/completions", json=body) for _ in range(100))
            )
            parked.cancel()
            return answers

    answers = asyncio.run(burst())
    assert [a.status_code for a in answers] == [503] * 100
    for answer in answers:
        assert answer.json()["error"]["code"] == "queue_full"
        assert int(answer.headers["retry-after"]) >= 1
