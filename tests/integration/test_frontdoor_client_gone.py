"""A client that closes its connection before a non-streamed answer: its request is
withdrawn from the queue if still waiting, or aborted in the engine if running (the
frontdoor watches for the client leaving through admission and the answer alike). Its
access-log line counts the tokens the ledger bills, streamed or not."""

from __future__ import annotations

import json
import re
import socket

import httpx
import pytest
from support import Platform, deploy, deployment, temp_home, wait_until
from support.billing import raw_usage

from ebb.queue import keys

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def platform(redis_server):
    p = Platform(home=temp_home("ebb-client-gone-"), redis_url=redis_server.url).start()
    with p.admin() as admin:
        # 50 ms a token: 400 tokens run for 20 s, long past the client leaving.
        deploy(admin, "slow", "fake://m?step_ms=50", min_replicas=1)
        # Its runner loads for a minute: a request waits in the queue meanwhile.
        deploy(admin, "stuck", "fake://m?load_s=60", admission_timeout_s=600)
        wait_until(lambda: deployment(admin, "slow")["replicas"]["ready"] == 1, 60, "runner")
    yield p
    assert p.stop() == 0


def _send_and_leave_open(platform: Platform, model: str) -> socket.socket:
    """A non-streamed chat request sent on a raw connection, its answer never read."""
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 400}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {platform.admin_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    host, port = platform.base_url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)))
    conn.sendall(head + body)
    return conn


def _log(platform: Platform) -> str:
    return (platform.home / "logs" / "frontdoor.log").read_text(errors="replace")


def test_a_client_that_leaves_while_queued_has_its_request_withdrawn(platform):
    with platform.admin() as admin:
        conn = _send_and_leave_open(platform, "stuck")
        wait_until(lambda: deployment(admin, "stuck")["queue_depth"] == 1, 30, "it to queue")
        conn.close()
        wait_until(lambda: deployment(admin, "stuck")["queue_depth"] == 0, 30, "its withdrawal")
    wait_until(lambda: "cancelled by client (withdrawn)" in _log(platform), 30, "the log line")


def test_a_client_that_leaves_while_its_request_runs_has_it_aborted(platform):
    r = platform.redis()

    def claimed() -> list[bytes]:
        return [k for k in r.scan_iter(match=keys.request("*")) if r.hget(k, "state") == b"claimed"]

    conn = _send_and_leave_open(platform, "slow")
    [request] = wait_until(claimed, 30, "a runner to claim it")
    conn.close()
    wait_until(lambda: r.hget(request, "cancel_requested") == b"1", 30, "the abort request")
    wait_until(lambda: "cancelled by client (aborting)" in _log(platform), 30, "the log line")


def _access_counts(platform: Platform, request_id: str) -> tuple[int, int] | None:
    """(prompt, completion) tokens of the request's access-log line, once it is written."""
    for line in _log(platform).splitlines():
        if f"ebb.access [{request_id}] access " in line:
            found = re.search(r"prompt_tokens=(\d+) completion_tokens=(\d+)", line)
            assert found, line
            return int(found[1]), int(found[2])
    return None


def _billed(platform: Platform, request_id: str) -> tuple[int, int] | None:
    records = [u for u in raw_usage(platform.redis()) if u.request_id == request_id]
    return (records[0].prompt_tokens, records[0].completion_tokens) if records else None


def test_a_cancelled_streams_access_line_counts_what_the_ledger_bills(platform):
    body = {"model": "slow", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    body["max_tokens"] = 400
    headers = {"Authorization": f"Bearer {platform.admin_key}"}
    with (
        httpx.Client(base_url=platform.base_url, headers=headers, timeout=60) as c,
        c.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        request_id = r.headers["x-request-id"]
        lines = (line for line in r.iter_lines() if line)
        got = [next(lines) for _ in range(10)]  # ten chunks, then the client leaves
    assert all(line.startswith('data: {"id"') for line in got), got
    billed = wait_until(lambda: _billed(platform, request_id), 30, "its usage record")
    logged = wait_until(lambda: _access_counts(platform, request_id), 30, "its access line")
    assert billed[1] > 0, "it generated before the client left"
    assert logged == billed


def test_a_cancelled_answers_access_line_counts_what_the_ledger_bills(platform):
    r = platform.redis()

    def claimed() -> list[bytes]:
        return [k for k in r.scan_iter(match=keys.request("*")) if r.hget(k, "state") == b"claimed"]

    conn = _send_and_leave_open(platform, "slow")
    [request] = wait_until(claimed, 30, "a runner to claim it")
    request_id = request.decode().removeprefix(keys.REQUEST_PREFIX)
    # Claimed, then output: it generates before the client leaves.
    wait_until(lambda: r.xlen(keys.events(request_id)) > 2, 30, "its first tokens")
    conn.close()
    billed = wait_until(lambda: _billed(platform, request_id), 30, "its usage record")
    logged = wait_until(lambda: _access_counts(platform, request_id), 30, "its access line")
    assert billed[1] > 0 and logged == billed


def test_a_request_past_its_deployments_time_limit_is_stopped_and_billed_what_it_made(platform):
    with platform.admin() as admin:
        # 50 ms a token: 400 tokens would run for 20 s, past the 1 s limit.
        deploy(admin, "bounded", "fake://m?step_ms=50", serving={"max_request_s": 1})
        body = {"model": "bounded", "messages": [{"role": "user", "content": "hi"}]}
        body["max_tokens"] = 400
        whole = admin.post("/v1/chat/completions", json=body)
        with admin.stream("POST", "/v1/chat/completions", json=body | {"stream": True}) as r:
            request_id = r.headers["x-request-id"]
            events = [line for line in r.iter_lines() if line]
    assert whole.status_code == 504, whole.text
    assert whole.json()["error"]["code"] == "request_timeout"
    assert "serving.max_request_s" in whole.json()["error"]["message"]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "request_timeout", error
    billed = wait_until(lambda: _billed(platform, request_id), 30, "its usage record")
    logged = wait_until(lambda: _access_counts(platform, request_id), 30, "its access line")
    assert 0 < billed[1] < 400 and logged == billed
