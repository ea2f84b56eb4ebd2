"""Logs: JSON lines with the request id on every line about a request, one access line
per request, and `ebb logs` (over the API) following a runner's output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from support import REPO_ROOT, Platform, deploy, deployment, temp_home, wait_until

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform():
    p = Platform(
        home=temp_home("ebb-logs-"), redis_url=None, env_extra={"EBB_LOG_FORMAT": "json"}
    ).start()
    yield p
    assert p.stop() == 0


def ensure(admin, name: str, source: str, **fields) -> None:
    if admin.get(f"/v1/deployments/{name}").status_code == 404:
        deploy(admin, name, source, **fields)


def json_lines(platform, name: str) -> list[dict]:
    path = platform.home / "logs" / f"{name}.log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def test_one_access_line_per_request_with_its_id_tenant_status_tokens_and_timings(platform, admin):
    deploy(admin, "acc", "fake://acc", idle_timeout_s=600)
    response = admin.post(
        "/v1/chat/completions", json={"model": "acc", "messages": MESSAGES, "max_tokens": 5}
    )
    assert response.status_code == 200
    request_id = response.headers["x-request-id"]

    def access_lines():
        lines = [
            line
            for line in json_lines(platform, "frontdoor")
            if line["logger"] == "ebb.access" and line.get("request_id") == request_id
        ]
        return lines or None

    [line] = wait_until(access_lines, 10, "the request's access-log line")
    usage = response.json()["usage"]
    assert (line["tenant"], line["deployment"], line["status"]) == ("admin", "acc", 200)
    assert line["prompt_tokens"] == usage["prompt_tokens"]
    assert line["completion_tokens"] == 5
    assert line["duration_ms"] >= line["ttft_ms"] >= line["queue_ms"] >= 0


def test_every_frontdoor_line_about_a_refused_request_carries_its_id(platform, admin):
    deploy(admin, "slow", "fake://slow?load_s=30", admission_timeout_s=0.5)
    response = admin.post("/v1/chat/completions", json={"model": "slow", "messages": MESSAGES})
    assert response.status_code == 503
    request_id = response.headers["x-request-id"]

    def about_it():
        lines = [
            line for line in json_lines(platform, "frontdoor") if request_id in json.dumps(line)
        ]
        return len(lines) >= 2 and lines

    lines = wait_until(about_it, 10, "the refusal's log lines")
    assert all(line.get("request_id") == request_id for line in lines), lines
    assert {"ebb.access", "ebb.frontdoor.execution"} <= {line["logger"] for line in lines}


def test_ebb_logs_follows_a_runners_output(platform, admin):
    ensure(admin, "tail", "fake://tail?step_ms=20", idle_timeout_s=600)
    body = {"model": "tail", "messages": MESSAGES, "max_tokens": 1}
    assert admin.post("/v1/chat/completions", json=body).status_code == 200
    [runner] = [r for r in deployment(admin, "tail")["runners"] if r["state"] == "ready"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("EBB_")}
    env.update(EBB_PORT=str(platform.port), EBB_ADMIN_KEY=platform.admin_key)
    follower = subprocess.Popen(
        [sys.executable, "-m", "ebb", "logs", "-f", "--runner", runner["id"], "--tail", "1"],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(follower.stdout), daemon=True)
    reader.start()
    try:
        wait_until(lambda: seen, 30, "ebb logs -f to print the runner's last line")
        assert not any("client left" in line for line in seen)
        # A client that leaves mid-stream: the runner logs the abort, after we started.
        with admin.stream(
            "POST", "/v1/chat/completions", json={**body, "max_tokens": 500, "stream": True}
        ) as response:
            next(line for line in response.iter_lines() if line.startswith("data: "))
            request_id = response.headers["x-request-id"]
        line = wait_until(
            lambda: next((s for s in seen if "client left" in s), None),
            30,
            "ebb logs -f to print the runner's abort line",
        )
        assert json.loads(line)["request_id"] == request_id
    finally:
        follower.terminate()
        follower.wait(timeout=10)


def test_ebb_logs_of_a_deployment_and_since(platform, admin):
    ensure(admin, "tail", "fake://tail?step_ms=20", idle_timeout_s=600)
    shown = platform.cli("logs", "tail")
    assert shown.returncode == 0, shown.stderr
    assert "runner: " in shown.stdout and shown.stdout.startswith("runner-")
    future = platform.cli("logs", "tail", "--since", "2999-01-01T00:00:00")
    assert future.returncode == 0 and future.stdout == ""
    unknown = platform.cli("logs", "nope")
    assert unknown.returncode == 1 and "No deployment 'nope'" in unknown.stderr
