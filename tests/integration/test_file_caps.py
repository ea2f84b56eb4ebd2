"""Files and batches within bounds (issue 46, finding 6), on the fake engine: a tenant's
files are capped in count and bytes (an atomic reservation: uploads racing at the edge
cannot both pass), `DELETE /v1/files/{id}` frees the bytes and the share, files expire
and the sweep removes them from disk; a batch's lines are capped, and `POST /v1/batches`
answers `validating` while the lines are queued in the background."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
import redis.asyncio as aioredis
from support import Platform, deploy, temp_home, wait_until
from support.billing import new_key, tenant_client

from ebb.queue import keys
from ebb.queue.batch_store import BatchRecord, BatchStatus, BatchStore
from ebb.queue.file_quota import FileQuotaStore

pytestmark = pytest.mark.integration

MAX_FILES = 3
MAX_BYTES = 200_000
MAX_LINES = 400
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform():
    env = {
        "EBB_FILES_MAX_PER_TENANT": str(MAX_FILES),
        "EBB_FILES_MAX_BYTES_PER_TENANT": str(MAX_BYTES),
        "EBB_BATCH_MAX_LINES": str(MAX_LINES),
        "EBB_BATCH_RESUME_AFTER_S": "2",
    }
    p = Platform(home=temp_home("ebb-file-caps-"), redis_url=None, env_extra=env).start()
    with p.admin() as admin:
        deploy(admin, "caps-m", "fake://m?step_ms=1", idle_timeout_s=120)
    yield p
    assert p.stop() == 0


def _client(platform: Platform, admin: httpx.Client, tenant: str) -> httpx.Client:
    return tenant_client(platform, new_key(admin, tenant))


def _upload(client: httpx.Client, content: bytes, **form: str) -> httpx.Response:
    return client.post(
        "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch", **form}
    )


def _line(custom_id: str) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "caps-m", "messages": MESSAGES, "max_tokens": 2},
    }


def _jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


SMALL = _jsonl([_line("a")])


def _on_disk(platform: Platform, file_id: str) -> bool:
    return (platform.home / "files" / file_id).exists()


def test_delete_removes_the_file_and_frees_its_share(platform, admin):
    client = _client(platform, admin, "caps-del")
    ids = []
    for _ in range(MAX_FILES):
        uploaded = _upload(client, SMALL)
        assert uploaded.status_code == 200, uploaded.text
        ids.append(uploaded.json()["id"])
    refused = _upload(client, SMALL)
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded" and error["param"] == "file"
    assert "DELETE /v1/files" in error["message"] and str(MAX_FILES) in error["message"]

    # Nobody else may delete it (it does not exist for them), and it stays.
    other = _client(platform, admin, "caps-other")
    assert other.delete(f"/v1/files/{ids[0]}").status_code == 404
    assert client.get(f"/v1/files/{ids[0]}").status_code == 200

    deleted = client.delete(f"/v1/files/{ids[0]}")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"id": ids[0], "object": "file", "deleted": True}
    assert client.get(f"/v1/files/{ids[0]}").status_code == 404
    assert client.get(f"/v1/files/{ids[0]}/content").status_code == 404
    assert not _on_disk(platform, ids[0])
    assert ids[0] not in [f["id"] for f in client.get("/v1/files").json()["data"]]
    assert client.delete(f"/v1/files/{ids[0]}").status_code == 404
    # Its share is free again: one more upload passes, the next is refused.
    assert _upload(client, SMALL).status_code == 200
    assert _upload(client, SMALL).status_code == 403
    # The admin may delete any tenant's file.
    assert admin.delete(f"/v1/files/{ids[1]}").json()["deleted"] is True
    assert _upload(client, SMALL).status_code == 200


def test_the_bytes_cap_refuses_and_says_what_to_do(platform, admin):
    client = _client(platform, admin, "caps-bytes")
    big = _jsonl([_line(f"b{i}") for i in range(2000)])[: MAX_BYTES * 2 // 3]
    big = big[: big.rindex(b"\n") + 1]  # two thirds of the cap: a second one would pass it
    first = _upload(client, big)
    assert first.status_code == 200, first.text
    refused = _upload(client, big)
    assert refused.status_code == 403
    message = refused.json()["error"]["message"]
    assert str(MAX_BYTES) in message and "Delete files" in message
    assert client.delete(f"/v1/files/{first.json()['id']}").status_code == 200
    assert _upload(client, big).status_code == 200


def test_concurrent_uploads_at_the_edge_cannot_both_pass(platform, admin):
    client = _client(platform, admin, "caps-race")
    for _ in range(MAX_FILES - 1):
        assert _upload(client, SMALL).status_code == 200
    statuses: list[int] = []
    start = threading.Barrier(6)

    def upload() -> None:
        with tenant_client(platform, client.headers["Authorization"][7:]) as own:
            start.wait()
            statuses.append(_upload(own, SMALL).status_code)

    threads = [threading.Thread(target=upload) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [200, 403, 403, 403, 403, 403]
    assert len(client.get("/v1/files").json()["data"]) == MAX_FILES


async def test_reservations_racing_in_redis_grant_exactly_the_room(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    store = FileQuotaStore(client)

    async def reserve(i: int) -> bool:
        held = await store.reserve(
            "t", f"file-{i}", size_bytes=10, max_files=100, max_bytes=55, expires_at_s=10**10
        )
        return not held.refused_by

    granted = await asyncio.gather(*(reserve(i) for i in range(40)))
    assert sum(granted) == 5
    assert (await store.holdings("t")).bytes == 50
    # Released once however often: the share comes back once.
    winner = f"file-{granted.index(True)}"
    assert await store.release("t", winner) is True
    assert await store.release("t", winner) is False
    assert (await store.holdings("t")).bytes == 40
    await client.aclose()


def _expires(anchor: str, seconds: str) -> dict[str, str]:
    """OpenAI's `expires_after`, as the SDK sends it in the multipart form."""
    return {"expires_after[anchor]": anchor, "expires_after[seconds]": seconds}


def test_expired_files_are_swept_from_disk(platform, admin):
    client = _client(platform, admin, "caps-expiry")
    kept = _upload(client, SMALL, **_expires("created_at", "3600"))
    assert kept.status_code == 200, kept.text
    view = kept.json()
    assert view["expires_at"] == view["created_at"] + 3600
    default = _upload(client, SMALL).json()
    assert default["expires_at"] == default["created_at"] + 30 * 86400  # the retention
    for refused in (
        _upload(client, SMALL, **_expires("last_active_at", "3600")),
        _upload(client, SMALL, **_expires("created_at", "60")),
        _upload(client, SMALL, **_expires("created_at", "3600\u00b2")),
        _upload(client, SMALL, **_expires("created_at", str(10**30))),
    ):
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"].startswith("expires_after")
    assert _on_disk(platform, view["id"])

    # Its time comes (the retention's end, here brought forward): the sweep deletes it.
    redis = platform.redis()
    assert redis.zadd(keys.FILES_EXPIRY, {f"{view['id']} caps-expiry": 1}, xx=True, ch=True) == 1
    wait_until(
        lambda: client.get(f"/v1/files/{view['id']}").status_code == 404,
        30,
        "the expired file to be swept",
    )
    assert not _on_disk(platform, view["id"])
    assert _on_disk(platform, default["id"])
    assert redis.hlen(keys.tenant_files("caps-expiry")) == 1  # its share given back


def _create_batch(client: httpx.Client, file_id: str) -> httpx.Response:
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    return client.post("/v1/batches", json=body)


def test_a_batch_over_the_line_cap_is_a_400_naming_the_count(platform, admin):
    client = _client(platform, admin, "caps-lines")
    many = b"".join(b'{"x": %d}\n' % i for i in range(MAX_LINES + 1))
    uploaded = _upload(client, many)
    assert uploaded.status_code == 200, uploaded.text
    refused = _create_batch(client, uploaded.json()["id"])
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "input_file_id" and error["code"] == "too_many_lines"
    assert f"{MAX_LINES + 1} requests" in error["message"] and str(MAX_LINES) in error["message"]
    assert client.get("/v1/batches").json()["data"] == []


def test_a_large_batch_answers_validating_and_then_completes(platform, admin):
    client = _client(platform, admin, "caps-large")
    total = MAX_LINES
    uploaded = _upload(client, _jsonl([_line(f"l{i}") for i in range(total)]))
    assert uploaded.status_code == 200, uploaded.text
    created = _create_batch(client, uploaded.json()["id"])
    assert created.status_code == 200, created.text
    batch = created.json()
    # Answered before its lines became jobs: validating, nothing counted yet.
    assert batch["status"] == "validating" and batch["request_counts"]["total"] == 0
    redis = platform.redis()
    assert redis.zcard(keys.tenant_jobs("caps-large")) < total
    done = wait_until(
        lambda: (
            (b := client.get(f"/v1/batches/{batch['id']}").json())["status"]
            in ("completed", "failed", "expired", "cancelled")
            and b
        ),
        240,
        "the large batch to complete",
        poll_s=0.5,
    )
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": total, "completed": total, "failed": 0}
    outputs = client.get(f"/v1/files/{done['output_file_id']}/content").text.splitlines()
    assert len(outputs) == total
    # Settled, the batch lets its jobs' records go (within the hour), and keeps its counts.
    job_id = json.loads(outputs[0])["response"]["request_id"]
    assert 0 < redis.ttl(keys.job(job_id)) <= 3600
    assert client.get(f"/v1/batches/{batch['id']}").json()["request_counts"]["completed"] == total


def test_a_batch_whose_queueing_frontdoor_died_is_taken_over_once_its_lease_lapses(platform, admin):
    client = _client(platform, admin, "caps-takeover")
    file_id = _upload(client, _jsonl([_line(f"t{i}") for i in range(3)])).json()["id"]
    now = int(time.time()) - 60
    record = BatchRecord(
        batch_id="batch_caps_takeover",
        tenant="caps-takeover",
        endpoint="/v1/chat/completions",
        input_file_id=file_id,
        completion_window="24h",
        created_at_s=now,
        expires_at_s=now + 86400,
        status=BatchStatus.VALIDATING,
    )
    run_info = json.loads((platform.home / "run.json").read_text())

    async def store_as_a_dead_frontdoor_left_it() -> None:
        redis = aioredis.Redis.from_url(run_info["redis_url"])
        store = BatchStore(redis, retention_s=3600, delivery_ttl_s=3600)
        await store.create(record)
        assert await store.hold_work(record.batch_id, "dead-frontdoor", ttl_s=3)
        await redis.aclose()

    asyncio.run(store_as_a_dead_frontdoor_left_it())
    # While the dead frontdoor's lease holds, nobody else queues its lines.
    assert client.get(f"/v1/batches/{record.batch_id}").json()["status"] == "validating"
    done = wait_until(
        lambda: (
            (b := client.get(f"/v1/batches/{record.batch_id}").json())["status"] == "completed"
            and b
        ),
        60,
        "a watcher to take the batch over and the batch to complete",
    )
    assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
