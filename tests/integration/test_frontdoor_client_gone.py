"""A client that closes its connection before a non-streamed answer: its request is
withdrawn from the queue if still waiting, or aborted in the engine if running (the
frontdoor watches for the client leaving through admission and the answer alike)."""

from __future__ import annotations

import json
import socket

import pytest
from support import Platform, deploy, deployment, temp_home, wait_until

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
