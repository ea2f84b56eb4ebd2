"""The default model's checkpoint served from S3 end to end: uploaded to moto's S3 server,
deployed as s3://..., fetched by the platform into an empty weight cache on deploy, loaded
by a real vLLM runner from that cache, and asked about France through the openai client.
"""

from __future__ import annotations

import shutil

import pytest
from support import Platform, temp_home, wait_until
from support.weights import MotoS3, upload_dir

pytestmark = pytest.mark.e2e

SOURCE = "s3://models/smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def stack(default_local_model):
    s3 = MotoS3()
    client = s3.client()
    client.create_bucket(Bucket="models")
    # The converted entry as it lies in a cache (its manifest and seal included).
    uploaded = upload_dir(client, "models", "smollm2-135m-instruct", default_local_model.path)
    home = temp_home("ebb-e2e-s3-")
    env = {**s3.env(), "EBB_WEIGHTS_CACHE_DIR": str(home / "cache")}  # empty: must fetch
    platform = Platform(home=home, redis_url=None, env_extra=env).start(timeout_s=300)
    yield platform, default_local_model, uploaded
    assert platform.stop() == 0
    s3.stop()
    shutil.rmtree(home / "cache", ignore_errors=True)  # 270 MB; the logs stay for debugging


@pytest.fixture(scope="module")
def admin(stack):
    with stack[0].admin() as client:
        yield client


def test_deploy_from_s3_fetches_into_the_cache(stack, admin):
    _, local, uploaded = stack
    assert "model.safetensors" in uploaded
    # No pre-warmed runner here: a fresh runner's cold start on CPU outlasts the default
    # 10 s admission window, so this deployment's callers wait for it.
    spec = {"name": "smol-s3", "source": SOURCE, "idle_timeout_s": 300, "admission_timeout_s": 180}
    created = admin.post("/v1/deployments", json=spec)
    assert created.status_code == 201, created.text

    body = wait_until(
        lambda: (d := admin.get("/v1/deployments/smol-s3").json())["weights"] != "preparing" and d,
        300,
        "the weights to be fetched",
        poll_s=0.5,
    )

    assert body["weights"] == "ready", body["error"]
    cache = admin.get("/v1/weights").json()
    (entry,) = cache["entries"]
    assert entry["source"] == SOURCE
    assert entry["size_bytes"] == local.size_bytes  # the same files, bookkeeping left out


def test_paris_from_the_s3_checkpoint(stack, admin):
    platform = stack[0]
    client = platform.openai(timeout=300)

    reply = client.chat.completions.create(
        model="smol-s3", messages=QUESTION, temperature=0, max_tokens=32
    )

    assert "Paris" in reply.choices[0].message.content
    body = admin.get("/v1/deployments/smol-s3").json()
    # The runner found the weights the deploy had fetched: a plain fresh start, no fetch.
    assert [r["tier"] for r in body["runners"] if r["state"] == "ready"] == ["fresh"]
    assert "fresh_fetch" not in body["cold_start_ms"]
    # A live runner holds its model: it cannot be evicted while it serves...
    (entry,) = admin.get("/v1/weights").json()["entries"]
    assert entry["in_use"] is True
    # ...and its exit lets go of it, whatever way the runner ends.
    assert admin.delete("/v1/deployments/smol-s3").status_code == 200
    wait_until(
        lambda: not admin.get("/v1/weights").json()["entries"][0]["in_use"],
        120,
        "the runner to exit and release its model",
        poll_s=0.5,
    )
