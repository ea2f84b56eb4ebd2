"""Hostile input and exposure on the real engine: the fields SDKs send as null, a job under
a key's request limit, a refused oversized body, and what a tenant key may read."""

from __future__ import annotations

import socket

import httpx
import pytest
from support import real_engine_platform, wait_for_weights, wait_until

from ebb.config import DEFAULT_MODEL_SOURCE

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
METRICS_TOKEN = "e2e-metrics-token-0123456789"


@pytest.fixture(scope="module")
def platform(default_local_model):
    with real_engine_platform("ebb-e2e-hostile-", EBB_METRICS_TOKEN=METRICS_TOKEN) as p:
        yield p


def test_hostile_input_and_exposure_on_the_real_engine(platform, admin):
    created = admin.post(
        "/v1/deployments",
        # A cold start on a busy 2-core machine can take longer than the default 10 s.
        json={
            "name": "smol-h",
            "source": DEFAULT_MODEL_SOURCE,
            "idle_timeout_s": 60,
            "admission_timeout_s": 300,
        },
    )
    assert created.status_code == 201, created.text
    wait_for_weights(admin, "smol-h")
    key = admin.post("/v1/keys", json={"tenant": "e2e-t"}).json()["key"]

    # The official client, with the nullable fields explicitly null (as SDKs send them).
    client = platform.openai(api_key=key, timeout=300)
    reply = client.chat.completions.create(
        model="smol-h", messages=QUESTION, max_tokens=16, temperature=0, stop=None, seed=None
    )
    assert "Paris" in reply.choices[0].message.content

    # Jobs under a key's two requests per minute: the third in a row is refused.
    limited = admin.post("/v1/keys", json={"tenant": "e2e-t", "requests_per_minute": 2})
    job_body = {"messages": QUESTION, "max_tokens": 16, "temperature": 0, "stop": None}
    submission = {"model": "smol-h", "endpoint": "chat.completions", "body": job_body}
    with httpx.Client(
        base_url=platform.base_url,
        timeout=60,
        headers={"Authorization": f"Bearer {limited.json()['key']}"},
    ) as jobs_client:
        answers = [jobs_client.post("/v1/jobs", json=submission) for _ in range(3)]
    assert [a.status_code for a in answers] == [202, 202, 429], answers[-1].text
    assert int(answers[2].headers["retry-after"]) >= 1
    job = answers[0]

    tenant = httpx.Client(
        base_url=platform.base_url, timeout=60, headers={"Authorization": f"Bearer {key}"}
    )
    done = wait_until(
        lambda: (
            (v := tenant.get(f"/v1/jobs/{job.json()['id']}").json())["status"]
            in ("succeeded", "failed")
            and v
        ),
        300,
        "the job to finish",
    )
    assert "Paris" in done["result"]["choices"][0]["message"]["content"]

    assert _declared_oversize_answer(platform).startswith(b"HTTP/1.1 413 ")

    seen = tenant.get("/v1/deployments/smol-h").json()
    assert seen["status"] == "ready" and "source" not in seen and seen["runners"] == []
    assert [r["pid"] for r in admin.get("/v1/deployments/smol-h").json()["runners"]]
    assert tenant.get("/metrics").status_code == 403
    scraped = httpx.get(
        platform.base_url + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
    )
    assert 'ebb_runners{deployment="smol-h",state="ready"}' in scraped.text
    tenant.close()


def _declared_oversize_answer(platform) -> bytes:
    """The answer to a 50 MB chat body, refused on its Content-Length before it is sent
    (a plain socket: an HTTP client sending the body could be reset before reading it)."""
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {platform.admin_key}\r\nContent-Type: application/json\r\n"
        "Content-Length: 50000000\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", platform.port), timeout=60) as sock:
        sock.sendall(head.encode())
        answer = b""
        while piece := sock.recv(65536):
            answer += piece
    assert b"request_too_large" in answer
    return answer
