"""A tenant's inputs at the edges of the platform (`ebb up`, fake engine): sources are
normalized before the allowlist is checked, and the answer does not depend on what exists
on disk; Batch API lines obey the caller's rate limits like jobs; a batch file that cannot
be validated is a 400 naming the line (never a 5xx) and a batch that cannot be queued
fails once, with the reason; a connection that never completes its request head is
closed."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from redis import asyncio as aioredis
from support import Platform, deploy, temp_home, wait_until
from support.billing import new_key, tenant_client

from ebb.queue import keys
from ebb.queue.batch_store import BatchRecord, BatchStatus, BatchStore

pytestmark = pytest.mark.integration

HEADER_TIMEOUT_S = 2
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform():
    env = {"EBB_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S), "EBB_BATCH_RESUME_AFTER_S": "1"}
    p = Platform(home=temp_home("ebb-inputs-"), redis_url=None, env_extra=env).start()
    with p.admin() as admin:
        deploy(admin, "inputs-m", "fake://m?step_ms=1", idle_timeout_s=120)
    yield p
    assert p.stop() == 0


def _tenant(platform: Platform, admin: httpx.Client, name: str, **limits) -> httpx.Client:
    return tenant_client(platform, new_key(admin, name, **limits))


def _line(custom_id: str, **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "inputs-m", "messages": MESSAGES, "max_tokens": 3, **body},
    }


def _upload(client: httpx.Client, content: bytes) -> str:
    response = client.post(
        "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}
    )
    assert response.status_code == 200, response.text
    return response.json()["id"]


def _create_batch(client: httpx.Client, file_id: str) -> httpx.Response:
    return client.post(
        "/v1/batches",
        json={
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    )


def _jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_sources_are_normalized_before_the_allowlist(platform, admin):
    quota = {"max_deployments": 4, "max_replicas": 4, "max_gpus": 4,
             "allowed_sources": ["/allowed/", "s3://acme-models"]}  # fmt: skip
    assert admin.put("/v1/tenants/src-t/quota", json=quota).status_code == 200
    client = _tenant(platform, admin, "src-t")

    def create(name: str, source: str) -> httpx.Response:
        return client.post("/v1/deployments", json={"name": name, "source": source})

    # Each spelling once named a directory outside /allowed/ and was deployed.
    for source in (
        "/allowed/../other",
        "file:///allowed/%2e%2e/other",
        "file:///allowed/%2E%2E/%2e%2E/etc",
        "/allowed//../other",
        "/allowed/./../other",
        "file:///allowed%2f..%2fother",
    ):
        refused = create("src-t-a", source)
        assert refused.status_code == 400, (source, refused.text)
        assert refused.json()["error"]["param"] == "source"
    # A prefix matches on segment boundaries only.
    evil = create("src-t-a", "s3://acme-models-evil/m")
    assert evil.status_code == 403 and evil.json()["error"]["param"] == "source"
    # Whether the path exists makes no difference to the answer (no file-existence oracle).
    there, absent = (create("src-t-a", f"/allowed/../../..{p}") for p in ("/etc", "/no-such-d"))
    assert there.status_code == absent.status_code == 400
    assert (
        there.json()["error"]["message"].replace("/etc", "/no-such-d")
        == absent.json()["error"]["message"]
    )
    # The deployment stores (and is checked by) the normalized source.
    made = create("src-t-b", "/allowed//models/m/")
    assert made.status_code == 201, made.text
    assert made.json()["source"] == "file:///allowed/models/m"
    assert create("src-t-c", "s3://acme-models/m").status_code == 201
    for name in ("src-t-b", "src-t-c"):
        assert client.delete(f"/v1/deployments/{name}").status_code == 200


def _batch_jobs(client: httpx.Client, batch_id: str) -> int:
    listed = client.get("/v1/jobs", params={"limit": 100}).json()["data"]
    return sum(1 for job in listed if (job.get("metadata") or {}).get("batch_id") == batch_id)


def _queued(client: httpx.Client, batch_id: str) -> dict:
    """The batch once its lines were validated and queued (in the background)."""
    return wait_until(
        lambda: (b := client.get(f"/v1/batches/{batch_id}").json())["status"] != "validating" and b,
        60,
        "the batch's lines to be queued",
    )


def test_batch_lines_wait_for_the_keys_requests_per_minute(platform, admin):
    rpm, total = 20, 24
    client = _tenant(platform, admin, "batch-rpm", requests_per_minute=rpm)
    file_id = _upload(client, _jsonl([_line(f"r{i}") for i in range(total)]))
    created = _create_batch(client, file_id)
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    queued = _queued(client, batch_id)
    # Only what the limit allows was queued; the rest waits, and is not failed.
    assert _batch_jobs(client, batch_id) <= rpm
    assert queued["request_counts"]["failed"] == 0
    assert client.post("/v1/chat/completions", json={
        "model": "inputs-m", "messages": MESSAGES, "max_tokens": 3}).status_code == 429  # fmt: skip
    done = wait_until(
        lambda: (b := client.get(f"/v1/batches/{batch_id}").json())["status"] == "completed" and b,
        90,
        "the waiting lines to be released and the batch to complete",
        poll_s=0.5,
    )
    assert done["request_counts"] == {"total": total, "completed": total, "failed": 0}
    assert _batch_jobs(client, batch_id) == total


def test_batch_lines_count_against_tokens_per_minute(platform, admin):
    # Each line reserves its prompt and max_tokens (400): two fit in 1000 tokens, not six.
    client = _tenant(platform, admin, "batch-tpm", tokens_per_minute=1000)
    file_id = _upload(client, _jsonl([_line(f"t{i}", max_tokens=400) for i in range(6)]))
    created = _create_batch(client, file_id)
    assert created.status_code == 200, created.text
    queued = _queued(client, created.json()["id"])
    assert _batch_jobs(client, created.json()["id"]) <= 2
    assert queued["status"] == "in_progress"


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (
            b'{"custom_id": "\\ud800", "method": "POST", "url": "/v1/chat/completions", '
            b'"body": {"model": "inputs-m"}}',
            "surrogate",
        ),  # fmt: skip
        (
            b'{"custom_id": "s", "method": "POST", "url": "/v1/chat/completions", "body": '
            b'{"model": "inputs-m", "user": "\\udfff"}}',
            "surrogate",
        ),  # fmt: skip
        (
            b'{"custom_id": "d", "method": "POST", "url": "/v1/chat/completions", "body": '
            b'{"model": "inputs-m", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
            "nested",
        ),
    ],
    ids=["surrogate-custom-id", "surrogate-in-body", "nested-100000"],
)
def test_a_line_that_is_not_strict_json_fails_the_batch_naming_it(platform, admin, line, says):
    # Lines are validated in the background (issue 46): the batch fails, as OpenAI's do.
    client = _tenant(platform, admin, "batch-bad")
    file_id = _upload(client, _jsonl([_line("first")]) + line + b"\n")
    created = _create_batch(client, file_id)
    assert created.status_code == 200, created.text
    failed = _queued(client, created.json()["id"])
    assert failed["status"] == "failed", failed
    [error] = failed["errors"]["data"]
    assert error["param"] == "input_file_id" and "line 2" in error["message"]
    assert error["line"] == 2 and says in error["message"]
    # No line ran, and the failed batch is no longer watched (never taken up again).
    assert _batch_jobs(client, created.json()["id"]) == 0
    redis = platform.redis()
    wait_until(
        lambda: created.json()["id"].encode() not in redis.smembers(keys.BATCHES_ACTIVE),
        30,
        "the failed batch to leave the watched set",
    )


def _store_validating(platform: Platform, tenant: str, file_id: str, batch_id: str) -> None:
    """A batch left `validating` (its creation interrupted), as the watcher finds it."""
    now = int(time.time()) - 60
    record = BatchRecord(
        batch_id=batch_id,
        tenant=tenant,
        endpoint="/v1/chat/completions",
        input_file_id=file_id,
        completion_window="24h",
        created_at_s=now,
        expires_at_s=now + 86400,
        status=BatchStatus.VALIDATING,
    )

    async def create() -> None:
        run_info = json.loads((platform.home / "run.json").read_text())
        client = aioredis.Redis.from_url(run_info["redis_url"])
        await BatchStore(client, retention_s=3600, delivery_ttl_s=3600).create(record)
        await client.aclose()

    asyncio.run(create())


def test_a_batch_that_cannot_be_resumed_fails_once_with_the_reason(platform, admin):
    client = _tenant(platform, admin, "batch-stuck")
    bad = b'{"custom_id": "\\ud800", "method": "POST", "url": "/v1/chat/completions"}\n'
    file_id = _upload(client, _jsonl([_line("ok")]) + bad)
    _store_validating(platform, "batch-stuck", file_id, "batch_stuck_failed")
    _store_validating(platform, "batch-stuck", file_id, "batch_stuck_cancel")
    cancelled = client.post("/v1/batches/batch_stuck_cancel/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelling"

    def settled(batch_id: str) -> dict | None:
        batch = client.get(f"/v1/batches/{batch_id}").json()
        return batch if batch["status"] not in ("validating", "cancelling") else None

    failed = wait_until(lambda: settled("batch_stuck_failed"), 30, "the stuck batch to fail")
    assert failed["status"] == "failed" and failed["failed_at"]
    [error] = failed["errors"]["data"]
    assert error["line"] == 2 and "surrogate" in error["message"]
    gone = wait_until(lambda: settled("batch_stuck_cancel"), 30, "the cancel to settle")
    assert gone["status"] == "cancelled"
    # Settled once: no longer watched, so never resumed again.
    redis = platform.redis()
    wait_until(
        lambda: (
            not {b"batch_stuck_failed", b"batch_stuck_cancel"}
            & set(redis.smembers(keys.BATCHES_ACTIVE))
        ),
        30,
        "the settled batches to leave the watched set",
    )


def test_a_connection_that_never_completes_its_head_is_closed(platform):
    for partial in (b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "):
        with socket.create_connection(("127.0.0.1", platform.port), timeout=60) as sock:
            sock.sendall(partial)
            # Blocks until the server closes it (b"") or the socket's own 60 s timeout.
            assert sock.recv(1024) == b"", partial
    # A whole request is still served.
    assert httpx.get(platform.base_url + "/healthz").status_code == 200


def test_creating_a_name_tells_nothing_of_another_tenants_private_one(platform, admin):
    quota = {"max_deployments": 2, "max_replicas": 2, "max_gpus": 2,
             "allowed_sources": ["fake://"]}  # fmt: skip
    for name in ("hide-t", "probe-t"):
        assert admin.put(f"/v1/tenants/{name}/quota", json=quota).status_code == 200
    hider, prober = _tenant(platform, admin, "hide-t"), _tenant(platform, admin, "probe-t")
    made = hider.post("/v1/deployments", json={"name": "hide-t-secret", "source": "fake://s"})
    assert made.status_code == 201, made.text

    def create(name: str) -> httpx.Response:
        return prober.post("/v1/deployments", json={"name": name, "source": "fake://p"})

    # The private name and a free one outside its namespace: the same refusal (once, a 409
    # for the first and a 201 for the second told which existed).
    taken, free = create("hide-t-secret"), create("hide-t-free")
    assert taken.status_code == free.status_code == 403, (taken.text, free.text)
    assert taken.json()["error"]["param"] == free.json()["error"]["param"] == "name"
    assert taken.json()["error"]["message"] == free.json()["error"]["message"]
    assert "'probe-t-'" in taken.json()["error"]["message"]
    # Within its own namespace it creates; a name it can see (the admin's, public) is a 409.
    assert create("probe-t-mine").status_code == 201
    assert create("inputs-m").status_code == 409
    for client, name in ((hider, "hide-t-secret"), (prober, "probe-t-mine")):
        assert client.delete(f"/v1/deployments/{name}").status_code == 200
    # A tenant whose namespace would nest with theirs gets no key: it could probe from
    # inside "hide-t-" (and any spelling differing only in case is the same namespace).
    for nested in ("hide-t-eu", "HIDE-T", "hide"):
        refused = admin.post("/v1/keys", json={"tenant": nested, "name": "k"})
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["param"] == "tenant"
        assert "'hide-t'" in refused.json()["error"]["message"]
    assert admin.post("/v1/keys", json={"tenant": "hide-t", "name": "k2"}).status_code == 201
    assert admin.post("/v1/keys", json={"tenant": "hidet", "name": "k"}).status_code == 201
