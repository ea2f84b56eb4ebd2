"""The Batch API's lifecycle on a platform whose files live in the object store (moto's S3
server, fake engine): input, output and error files in the bucket and nothing under
EBB_HOME; a batch past its completion window expires; and every platform process, the
runner and Redis killed with SIGKILL mid-batch lose nothing and run nothing twice."""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest
from support import Platform, deploy, temp_home, wait_until
from support.chaos import Chaos
from support.weights import MotoS3

from ebb.frontdoor.files import S3FileStore
from ebb.queue import keys
from ebb.queue.batch_store import BatchRecord

pytestmark = pytest.mark.integration

BUCKET = "ebb-batch-files"
PREFIX = "batch-files"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
SETTLED = ("completed", "expired", "cancelled", "failed")


@pytest.fixture(scope="module")
def s3():
    moto = MotoS3()
    moto.client().create_bucket(Bucket=BUCKET)
    yield moto
    moto.stop()


@pytest.fixture(scope="module")
def platform(s3):
    env = {
        **s3.env(),
        "EBB_FILES_S3_BUCKET": BUCKET,
        "EBB_FILES_S3_PREFIX": PREFIX,
        "EBB_BATCH_RESUME_AFTER_S": "1",
    }
    p = Platform(home=temp_home("ebb-it-batches-"), redis_url=None, env_extra=env).start()
    yield p
    assert p.stop() == 0


def _objects(s3) -> set[str]:
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/")
    return {o["Key"].removeprefix(f"{PREFIX}/") for o in listed.get("Contents", [])}


def _batch_file(lines: list[dict]) -> bytes:
    return "\n".join(json.dumps(line) for line in lines).encode() + b"\n"


def _chat_line(custom_id: str, model: str, **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": MESSAGES, "max_tokens": 5, **body},
    }


def _batch(admin: httpx.Client, batch_id: str) -> dict | None:
    """The batch as the API shows it; None while the frontdoor is down or restarting."""
    try:
        response = admin.get(f"/v1/batches/{batch_id}", timeout=10)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def _settled(admin: httpx.Client, batch_id: str, timeout_s: float = 120) -> dict:
    def look():
        batch = _batch(admin, batch_id)
        return batch if batch and batch["status"] in SETTLED else None

    return wait_until(look, timeout_s, f"batch {batch_id} to settle", poll_s=0.2)


def _lines_of(admin: httpx.Client, file_id: str) -> list[dict]:
    response = admin.get(f"/v1/files/{file_id}/content")
    assert response.status_code == 200, response.text
    return [json.loads(x) for x in response.text.splitlines()]


def test_batch_files_live_in_the_object_store(platform, admin, s3):
    deploy(admin, "s3-batch", source="fake://m?ctx=4096")
    client = platform.openai()
    content = _batch_file([_chat_line("a", "s3-batch"), _chat_line("bad", "s3-batch", top_p=7)])
    uploaded = client.files.create(file=("in.jsonl", content), purpose="batch")
    assert {uploaded.id, f"{uploaded.id}.json"} <= _objects(s3)
    assert s3.client().get_object(Bucket=BUCKET, Key=f"{PREFIX}/{uploaded.id}")["Body"].read() == (
        content
    )
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = _settled(admin, batch.id)
    assert done["status"] == "completed"
    assert {done["output_file_id"], done["error_file_id"]} <= _objects(s3)
    (output,) = _lines_of(admin, done["output_file_id"])
    assert output["custom_id"] == "a" and output["response"]["status_code"] == 200
    (error,) = _lines_of(admin, done["error_file_id"])
    assert error["custom_id"] == "bad" and "top_p" in error["error"]["message"]
    listed = {f.id for f in client.files.list().data}
    assert {uploaded.id, done["output_file_id"], done["error_file_id"]} <= listed
    assert not (platform.home / "files").exists(), "files were written under EBB_HOME"


def test_the_s3_file_store_writes_a_fixed_id_once(s3, monkeypatch):
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    store = S3FileStore(BUCKET, "store-test")
    first = store.put(
        b"one\n", tenant="t1", filename="o.jsonl", purpose="batch_output", file_id="f-x"
    )
    again = store.put(
        b"two\n", tenant="t1", filename="o.jsonl", purpose="batch_output", file_id="f-x"
    )
    assert again == first and store.content("f-x") == b"one\n"
    other = store.put(b"three\n", tenant="t2", filename="i.jsonl", purpose="batch")
    assert [i.file_id for i in store.list("t2")] == [other.file_id]
    assert {i.file_id for i in store.list(None)} == {"f-x", other.file_id}
    assert store.info("missing") is None and store.info("../f-x") is None
    with pytest.raises(FileNotFoundError):
        store.content("missing")


def test_a_batch_past_its_completion_window_expires(platform, admin, platform_redis):
    # No runner ever comes up: the lines wait in the queue until their window passes.
    deploy(admin, "s3-never", source="fake://m?fail=1")
    client = platform.openai()
    lines = [_chat_line("x", "s3-never"), _chat_line("y", "s3-never")]
    uploaded = client.files.create(file=("late.jsonl", _batch_file(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )

    # Its lines are queued in the background (issue 46): once they are, both have jobs.
    def queued() -> BatchRecord | None:
        record = msgspec.json.decode(platform_redis.get(keys.batch(batch.id)), type=BatchRecord)
        return record if record.status != "validating" else None

    record = wait_until(queued, 30, "the batch's lines to be queued")
    job_ids = [line.job_id for line in record.lines]
    assert len(job_ids) == 2 and all(job_ids)
    # As if the 24 hours had passed: the lines' TTL deadlines are now.
    platform_redis.zadd(keys.JOBS_WAITING, dict.fromkeys(job_ids, 0))
    done = _settled(admin, batch.id)
    assert done["status"] == "expired" and done["expired_at"]
    assert done["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
    assert done["output_file_id"] is None
    errors = _lines_of(admin, done["error_file_id"])
    assert sorted(e["custom_id"] for e in errors) == ["x", "y"]
    assert {e["error"]["code"] for e in errors} == {"expired"}
    # The runners that tried to load are billed their GPU time (loading is metered by
    # design), and a row may hold it; no request or token of the expired lines is.
    rows = admin.get("/v1/usage").json()["data"]
    billed = [
        (r["requests"], r["prompt_tokens"], r["completion_tokens"], r["token_cost_micros"])
        for r in rows
        if r["deployment"] == "s3-never"
    ]
    assert all(row == (0, 0, 0, 0) for row in billed), f"an expired line was billed: {billed}"


KILL_ORDER = ("runner", "frontdoor", "coldstart", "webhooks", "billing", "redis")


def test_every_process_killed_mid_batch_loses_nothing_and_runs_nothing_twice(
    platform, admin, platform_redis
):
    # One line at a time, 0.6 s each: the batch outlasts the six kills below.
    deploy(admin, "s3-long", source="fake://m?ctx=4096&step_ms=50", max_concurrency=1)
    client = platform.openai()
    total = 60
    lines = [_chat_line(f"r{i}", "s3-long", max_tokens=12) for i in range(total)]
    uploaded = client.files.create(file=("long.jsonl", _batch_file(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    chaos = Chaos(platform)
    completed = 0
    for role in KILL_ORDER:
        # Some progress since the last kill (the batch is alive), and not done yet.
        seen = wait_until(
            lambda after=completed: (
                (b := _batch(admin, batch.id)) and b["request_counts"]["completed"] > after and b
            ),
            120,
            f"the batch to make progress before the {role} is killed",
            poll_s=0.2,
        )
        assert seen["status"] == "in_progress", f"the batch ended before the {role} was killed"
        completed = seen["request_counts"]["completed"]
        chaos.kill(role)
    done = _settled(admin, batch.id, timeout_s=300)
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": total, "completed": total, "failed": 0}
    assert done["error_file_id"] is None
    output = _lines_of(admin, done["output_file_id"])
    assert sorted(o["custom_id"] for o in output) == sorted(f"r{i}" for i in range(total))
    job_ids = [o["response"]["request_id"] for o in output]
    assert len(set(job_ids)) == total
    assert all(o["response"]["body"]["usage"]["completion_tokens"] == 12 for o in output)
    # Nothing run twice: one job per line, each billed for exactly one finished attempt.
    record = msgspec.json.decode(platform_redis.get(keys.batch(batch.id)), type=BatchRecord)
    assert sorted(line.job_id for line in record.lines) == sorted(job_ids)
    usage = [json.loads(f[b"r"]) for _, f in platform_redis.xrange(keys.USAGE)]
    billed = [u["request_id"].rsplit(".", 1)[0] for u in usage if u["state"] == "finished"]
    mine = [j for j in billed if j in set(job_ids)]
    assert sorted(mine) == sorted(job_ids), "a line was billed twice or not at all"
    print("batch restarts:", chaos.killed)
