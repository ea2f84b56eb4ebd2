"""Issue 36 on the real engine: a job and a three-line batch submitted while their
deployment's weights are still being prepared are accepted (not refused 503
`weights_preparing`), and all of them succeed once the weights are ready. The weights
come from moto's S3 through a throttling proxy, so their fetch outlasts the deployment's
admission window by far (~25 s against 2 s)."""

from __future__ import annotations

import json
import shutil

import pytest
from support import Platform, temp_home, wait_until
from support.weights import CountingProxy, MotoS3, upload_dir

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


SOURCE = "s3://models/smol-late"


@pytest.fixture(scope="module")
def platform(default_local_model):
    s3 = MotoS3()
    client = s3.client()
    client.create_bucket(Bucket="models")
    # The converted entry as it lies in a cache (its manifest and seal included).
    upload_dir(client, "models", "smol-late", default_local_model.path)
    proxy = CountingProxy(s3.url, delay_s_per_mib=0.1)  # ~270 MB: ~25 s
    home = temp_home("ebb-e2e-jobs-waiting-")
    env = {**s3.env(proxy.url), "EBB_WEIGHTS_CACHE_DIR": str(home / "cache")}
    platform = Platform(home=home, redis_url=None, env_extra=env).start(timeout_s=300)
    yield platform
    assert platform.stop() == 0
    proxy.close()
    s3.stop()
    shutil.rmtree(home / "cache", ignore_errors=True)


def test_a_job_and_a_batch_submitted_while_weights_are_prepared_succeed(admin):
    spec = {
        "name": "smol-late",
        "source": SOURCE,
        "idle_timeout_s": 120,
        "admission_timeout_s": 2,  # what a synchronous request would wait
    }
    created = admin.post("/v1/deployments", json=spec)
    assert created.status_code == 201, created.text
    body = {"messages": QUESTION, "temperature": 0, "max_tokens": 8}
    submitted = admin.post(
        "/v1/jobs", json={"model": "smol-late", "endpoint": "chat.completions", "body": body}
    )
    assert submitted.status_code == 202, submitted.text
    job = submitted.json()
    assert admin.get("/v1/deployments/smol-late").json()["weights"] != "ready", (
        "the job must have been submitted while the weights were prepared"
    )
    assert job["waiting_for"] == "weights_preparing"

    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "smol-late", **body},
        }
        for i in range(3)
    ]
    content = "\n".join(json.dumps(line) for line in lines).encode()
    file = admin.post(
        "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}
    ).json()
    batch = admin.post(
        "/v1/batches",
        json={
            "input_file_id": file["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    ).json()

    def job_settled():
        view = admin.get(f"/v1/jobs/{job['id']}").json()
        return view["status"] in ("succeeded", "failed", "expired") and view

    view = wait_until(job_settled, 600, "the job to settle", poll_s=1)
    assert view["status"] == "succeeded", json.dumps(view)
    assert "Paris" in view["result"]["choices"][0]["message"]["content"]

    def batch_settled():
        view = admin.get(f"/v1/batches/{batch['id']}").json()
        return view["status"] in ("completed", "failed", "expired", "cancelled") and view

    done = wait_until(batch_settled, 300, "the batch to settle", poll_s=1)
    assert done["status"] == "completed", json.dumps(done)
    assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
