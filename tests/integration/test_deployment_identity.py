"""A deployment's identity is its uid, not its name (the whole platform, fake engine): a
name deleted and created again by another tenant shares no runner, no queued request and
no log with the deployment that had it; `GET /v1/logs` covers every version of a
deployment, and refuses a crafted cursor with a 400."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from support import Platform, deploy, deployment, wait_until
from support.billing import gpu_segments, new_key, raw_usage, tenant_client

from ebb.queue import keys
from ebb.queue.schema import decode_work

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def tenant(platform: Platform, admin: httpx.Client, name: str) -> httpx.Client:
    quota = {"max_deployments": 3, "max_replicas": 3, "max_gpus": 3, "allowed_sources": ["*"]}
    response = admin.put(f"/v1/tenants/{name}/quota", json=quota)
    assert response.status_code == 200, response.text
    return tenant_client(platform, new_key(admin, name))


def chat(client: httpx.Client, model: str) -> httpx.Response:
    return client.post(
        "/v1/chat/completions", json={"model": model, "messages": MESSAGES, "max_tokens": 3}
    )


def ready_runners(admin: httpx.Client, name: str, version: int = 1) -> list[str]:
    runners = deployment(admin, name)["runners"]
    return [r["id"] for r in runners if r["state"] == "ready" and r["version"] == version]


def log_sources(client: httpx.Client, **params) -> set[str]:
    response = client.get("/v1/logs", params=params)
    assert response.status_code == 200, response.text
    return {line["source"] for line in response.json()["data"]}


def test_a_name_deleted_and_created_again_shares_no_runner_and_no_log(platform, admin):
    """A tenant names new deployments within its namespace; the admin may give a freed
    name (its own) to another tenant."""
    beta, evil = tenant(platform, admin, "beta"), tenant(platform, admin, "evil")
    body = {"name": "reuse2", "min_replicas": 1, "idle_timeout_s": 600, "visibility": "private"}
    created = admin.post("/v1/deployments", json={**body, "source": "fake://b", "owner": "beta"})
    assert created.status_code == 201, created.text
    assert chat(beta, "reuse2").status_code == 200
    [old] = wait_until(lambda: ready_runners(admin, "reuse2"), 60, "beta's runner ready")
    beta_uid = created.json()["uid"]
    # Its runner's log, and the controller's decisions about it (by its uid).
    assert log_sources(beta, deployment="reuse2") == {f"runner-{old}", f"decisions-{beta_uid}"}

    assert beta.delete("/v1/deployments/reuse2").status_code == 200
    made = admin.post("/v1/deployments", json={**body, "source": "fake://e", "owner": "evil"})
    assert made.status_code == 201, made.text
    answers = [chat(evil, "reuse2") for _ in range(5)]
    assert [a.status_code for a in answers] == [200] * 5, [a.text for a in answers]

    ids = {a.headers["x-request-id"] for a in answers}
    served = {u.request_id: u.runner_id for u in raw_usage(platform.redis()) if u.request_id in ids}
    assert set(served) == ids
    assert old not in served.values(), "evil's requests ran on beta's runner"
    # Each ran on a runner launched for evil's deployment: its uid, not only its name.
    evil_uid = made.json()["uid"]
    assert evil_uid.startswith("dep_") and evil_uid != created.json()["uid"]
    r = platform.redis()
    for runner_id in set(served.values()):
        assert r.hget(keys.runner(runner_id), "deployment_uid").decode() == evil_uid
    wait_until(lambda: r.hget(keys.runner(old), "state") == b"exited", 60, "beta's runner to exit")
    # Its GPU time, to its exit, is beta's: none of it is billed to the name's new owner.
    segments = wait_until(lambda: gpu_segments(r, old), 30, "beta's runner's GPU time")
    assert {s.meter.tenant for s in segments} == {"beta"}

    # Evil reads the logs of its own runners only, by its deployment or naming one.
    evil_sources = log_sources(evil, deployment="reuse2")
    assert f"runner-{old}" not in evil_sources and f"decisions-{beta_uid}" not in evil_sources
    assert f"decisions-{evil_uid}" in evil_sources
    direct = evil.get("/v1/logs", params={"deployment": "reuse2", "runner": old})
    assert direct.status_code == 404, direct.text
    # Nor does the view of its deployment list beta's runner (its errors, its log tail).
    view = evil.get("/v1/deployments/reuse2").json()
    assert old not in [runner["id"] for runner in view.get("runners", [])]


def test_deleting_a_deployment_answers_what_waits_in_its_queue_at_once(platform, admin):
    deploy(admin, "doomed", "fake://doomed?load_s=30", admission_timeout_s=120)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(chat, admin, "doomed")
        wait_until(lambda: deployment(admin, "doomed")["queue_depth"] == 1, 30, "it to queue")
        assert admin.delete("/v1/deployments/doomed").status_code == 200
        # Well before its 120 s admission window: the delete answered it.
        response = waiting.result(timeout=60)
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["code"] == "deployment_deleted" and "deleted" in error["message"]


def test_deleting_a_deployment_fails_its_queued_job_with_the_reason(platform, admin):
    deploy(admin, "doomed-jobs", "fake://doomed?load_s=30")
    body = {
        "model": "doomed-jobs",
        "endpoint": "chat.completions",
        "body": {"messages": MESSAGES, "max_tokens": 3},
    }
    submitted = admin.post("/v1/jobs", json=body)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    # Its attempts carry the deployment's uid, so a retry after the name was created again
    # is failed by the new deployment's runner instead of run there.
    r = platform.redis()
    request_id = r.hget(keys.job(job_id), "request_id").decode()
    work = decode_work(r.hget(keys.request(request_id), "work"))
    assert work.deployment_uid and work.deployment_uid == deployment(admin, "doomed-jobs")["uid"]
    assert admin.delete("/v1/deployments/doomed-jobs").status_code == 200

    def settled() -> dict | None:
        view = admin.get(f"/v1/jobs/{job_id}").json()
        return view if view["status"] != "queued" and view["status"] != "running" else None

    view = wait_until(settled, 30, "the job to settle")
    assert view["status"] == "failed", view
    assert view["error"]["code"] == "deployment_deleted"


def test_logs_of_a_deployment_cover_every_version(platform, admin):
    deploy(admin, "vlog", "fake://v1", idle_timeout_s=600)
    assert chat(admin, "vlog").status_code == 200
    again = admin.post("/v1/deployments", json={"name": "vlog", "source": "fake://v2"})
    assert again.status_code == 201 and again.json()["deployed_version"] == 2, again.text
    rollout = admin.post("/v1/deployments/vlog/rollout", json={"strategy": "immediate"})
    assert rollout.status_code == 200, rollout.text

    def v2_runner() -> list[str] | None:
        chat(admin, "vlog")
        return ready_runners(admin, "vlog", version=2) or None

    [runner] = wait_until(v2_runner, 60, "a version-2 runner to serve")
    assert f"runner-{runner}" in log_sources(admin, deployment="vlog")


def _cursor(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()


@pytest.mark.parametrize(
    "cursor",
    [
        "!!not base64!!",
        base64.urlsafe_b64encode(b"\xff\xfe not json").decode(),
        _cursor([1, 2]),
        _cursor({"frontdoor.log": {"nested": 1}}),
        _cursor({"frontdoor.log": -5}),
        _cursor({"frontdoor.log": True}),
        _cursor({"../../etc/passwd": 1}),
        base64.urlsafe_b64encode(b'{"frontdoor.log": 1' + b"0" * 3000 + b"}").decode(),
        base64.urlsafe_b64encode(b"[" * 5000).decode(),
    ],
    ids=["not-base64", "not-json", "list", "nested", "negative", "bool", "path", "huge", "deep"],
)
def test_a_crafted_logs_cursor_is_a_400_naming_it(platform, admin, cursor):
    response = admin.get("/v1/logs", params={"cursor": cursor})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "cursor"


def test_a_cursor_this_api_returned_continues_where_it_ended(platform, admin):
    first = admin.get("/v1/logs", params={"tail": 1})
    assert first.status_code == 200
    after = admin.get("/v1/logs", params={"cursor": first.json()["cursor"]})
    assert after.status_code == 200, after.text
