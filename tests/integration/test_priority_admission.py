"""Priority classes at the frontdoor (fake engine): async jobs are queued in their caller's
class, a sheddable request at a saturated queue is shed before its prompt is tokenized,
and a tenant refused a deployment's priority is told what it may set."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from support import deploy, wait_until

from ebb.queue import keys
from ebb.queue.job_schema import attempt_request_id
from ebb.queue.priority import class_of_score

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "hi"}]


def caller_key(admin: httpx.Client, tenant: str, priority: str) -> str:
    key = admin.post("/v1/keys", json={"tenant": tenant, "name": "k"}).json()
    admin.put(f"/v1/keys/{key['id']}/limits", json={"priority": priority}).raise_for_status()
    return key["key"]


def test_a_job_is_queued_in_its_callers_class(platform):
    with platform.admin() as admin:
        # Its runner never gets ready: the attempts stay in the job queue.
        deploy(admin, "prio-jobq", source="fake://m?load_s=600", admission_timeout_s=600)
        keys_by_class = {
            p: caller_key(admin, f"prio-j{p[:3]}", p) for p in ("critical", "sheddable")
        }
    r = platform.redis()
    with httpx.Client(base_url=platform.base_url, timeout=60) as client:
        for priority, key in keys_by_class.items():
            body = {"model": "prio-jobq", "messages": MESSAGES, "max_tokens": 1}
            answer = client.post(
                "/v1/jobs",
                json={"model": "prio-jobq", "endpoint": "chat.completions", "body": body},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert answer.status_code == 202, answer.text
            attempt = attempt_request_id(answer.json()["id"], 1)
            unit = r.hget(keys.request(attempt), "deployment").decode()
            score = r.zscore(keys.job_queue(unit), attempt)
            assert score is not None and class_of_score(score) == priority


def test_a_sheddable_request_is_shed_before_its_prompt_is_tokenized(platform):
    with platform.admin() as admin:
        # Its runner never gets ready: whatever is admitted waits in the queue. A prompt
        # longer than 64 tokens is refused by the tokenizing step (a 400).
        deploy(
            admin,
            "prio-early",
            source="fake://m?load_s=600",
            queue_depth_limit=4,
            admission_timeout_s=600,
            max_model_len=64,
        )
        shed_key = caller_key(admin, "prio-es", "sheddable")

    def depth_is(n: int) -> bool:
        with platform.admin() as admin:
            return admin.get("/v1/deployments/prio-early").json()["queue_depth"] == n

    async def scenario() -> httpx.Response:
        async with httpx.AsyncClient(base_url=platform.base_url, timeout=120) as client:
            body = {"model": "prio-early", "messages": MESSAGES, "max_tokens": 1}
            admin_headers = {"Authorization": f"Bearer {platform.admin_key}"}
            # Two standard requests: half the depth limit (EBB_SHED_QUEUE_FRACTION 0.5).
            parked = [
                asyncio.ensure_future(
                    client.post("/v1/chat/completions", json=body, headers=admin_headers)
                )
                for _ in range(2)
            ]
            await asyncio.to_thread(wait_until, lambda: depth_is(2), 30, "2 queued")
            long_body = {**body, "messages": [{"role": "user", "content": "word " * 200}]}
            shed = await client.post(
                "/v1/chat/completions",
                json=long_body,
                headers={"Authorization": f"Bearer {shed_key}"},
            )
            for waiting in parked:
                waiting.cancel()
            return shed

    shed = asyncio.run(scenario())
    # Refused as shed, not as too long: it was not tokenized.
    assert shed.status_code == 503, shed.text
    assert shed.json()["error"]["code"] == "shed"
    assert int(shed.headers["retry-after"]) >= 1


def test_a_tenant_refused_a_deployments_priority_is_told_what_it_may_set(platform):
    with platform.admin() as admin:
        admin.put(
            "/v1/tenants/prio-msg/quota",
            json={"max_deployments": 1, "max_replicas": 1, "max_gpus": 1, "allowed_sources": ["*"]},
        ).raise_for_status()
        key = admin.post("/v1/keys", json={"tenant": "prio-msg", "name": "k"}).json()["key"]
    body = {"name": "prio-msg-m", "source": "fake://m", "priority": "critical"}
    with httpx.Client(base_url=platform.base_url, timeout=60) as tenant:
        refused = tenant.post(
            "/v1/deployments", json=body, headers={"Authorization": f"Bearer {key}"}
        )
    assert refused.status_code == 403
    message = refused.json()["error"]["message"]
    # Not the pricing and sharing commands: what a tenant may set, and what it may not.
    assert "ebb price" not in message and "ebb deployments share" not in message
    assert "may set" in message and "but not its priority" in message


def test_a_batch_line_is_queued_in_its_callers_class(platform):
    with platform.admin() as admin:
        deploy(admin, "prio-batchq", source="fake://m?load_s=600", admission_timeout_s=600)
        key = caller_key(admin, "prio-bcrit", "critical")
    client = platform.openai(api_key=key)
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "prio-batchq", "messages": MESSAGES, "max_tokens": 1},
    }
    uploaded = client.files.create(
        file=("in.jsonl", json.dumps(line).encode() + b"\n"), purpose="batch"
    )
    client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    r = platform.redis()
    queued = wait_until(
        lambda: r.zrange(keys.job_queue("prio-batchq"), 0, -1, withscores=True),
        60,
        "the batch line's job queued",
    )
    assert [class_of_score(score) for _, score in queued] == ["critical"]
