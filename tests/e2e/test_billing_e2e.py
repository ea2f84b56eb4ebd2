"""Billing end to end on the real engine: the usage the official `openai` client reports is
exactly what the ledger bills, an abandoned stream is billed for what was generated, and
the runner's GPU time reaches the ledger."""

from __future__ import annotations

import httpx
import msgspec
import pytest
from support import real_engine_platform, wait_until

from ebb.config import DEFAULT_MODEL_NAME
from ebb.queue import keys
from ebb.queue.schema import UsageRecord

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse."}]


@pytest.fixture(scope="module")
def platform(default_local_model):
    with real_engine_platform(
        "ebb-e2e-bill-", default_model=True, EBB_PREWARM="1", EBB_GPU_METER_INTERVAL_S="2"
    ) as p:
        yield p


@pytest.fixture(scope="module")
def platform_redis(platform):
    return platform.redis()


def raw_records(platform_redis) -> dict[str, UsageRecord]:
    records = [
        msgspec.json.decode(fields[b"r"], type=UsageRecord)
        for _, fields in platform_redis.xrange(keys.USAGE)
    ]
    return {r.request_id: r for r in records}


def test_the_usage_the_openai_client_reports_is_what_the_ledger_bills(platform, platform_redis):
    with platform.admin() as admin:
        priced = admin.patch(
            f"/v1/deployments/{DEFAULT_MODEL_NAME}",
            json={
                "price_per_1m_input_tokens_micros": 150_000,
                "price_per_1m_output_tokens_micros": 600_000,
                "price_per_gpu_second_micros": 278,
                "min_replicas": 1,  # billing is under test here, not the cold start
            },
        )
        assert priced.status_code == 200, priced.text
        wait_until(
            lambda: admin.get(f"/v1/deployments/{DEFAULT_MODEL_NAME}").json()["status"] == "ready",
            300,
            "the runner to be ready",
        )
        key = admin.post("/v1/keys", json={"tenant": "e2e-acme"}).json()["key"]
    client = platform.openai(api_key=key, timeout=120)

    told = []
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME, messages=QUESTION, temperature=0, max_tokens=24
    )
    assert "Paris" in reply.choices[0].message.content
    told.append(reply.usage)
    chunks = list(
        client.chat.completions.create(
            model=DEFAULT_MODEL_NAME,
            messages=QUESTION,
            temperature=0,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    told.append(chunks[-1].usage)
    completion = client.completions.create(
        model=DEFAULT_MODEL_NAME, prompt="The capital of France is", max_tokens=8, n=2
    )
    told.append(completion.usage)

    # A stream abandoned after a few tokens is billed for what the engine generated.
    abandoned = client.chat.completions.with_raw_response.create(
        model=DEFAULT_MODEL_NAME, messages=STORY, max_tokens=400, stream=True
    )
    abandoned_id = abandoned.headers["x-request-id"]
    stream = abandoned.parse()
    seen = sum(1 for _, chunk in zip(range(3), stream, strict=False) if chunk.choices)
    stream.close()
    cancelled = wait_until(
        lambda: raw_records(platform_redis).get(abandoned_id), 60, "the abandoned stream's bill"
    )
    assert cancelled.state in ("cancelled", "finished")
    assert seen <= cancelled.completion_tokens <= 400

    expected_prompt = sum(u.prompt_tokens for u in told) + cancelled.prompt_tokens
    expected_completion = sum(u.completion_tokens for u in told) + cancelled.completion_tokens
    tenant = httpx.Client(
        base_url=platform.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )
    total = wait_until(
        lambda: (t := tenant.get("/v1/usage").json()["total"])["requests"] == 4 and t,
        60,
        "the ledger to fold the tenant's four requests",
    )
    assert total["prompt_tokens"] == expected_prompt
    assert total["completion_tokens"] == expected_completion
    billed = [r for r in raw_records(platform_redis).values() if r.tenant == "e2e-acme"]
    assert total["token_cost_micros"] == sum(
        (r.prompt_tokens * 150_000 + r.completion_tokens * 600_000 + 500_000) // 1_000_000
        for r in billed
    )

    with platform.admin() as admin:
        # The runner's GPU time, billed to the deployment's owner at its price.
        row = wait_until(
            lambda: {r["deployment"]: r for r in admin.get("/v1/usage").json()["data"]}.get(
                DEFAULT_MODEL_NAME, {}
            ).get("gpu_cost_micros"),
            60,
            "the runner's GPU time in the ledger",
        )
        assert row > 0
        reconciled = admin.get("/v1/usage/reconcile").json()
        assert reconciled["ok"], reconciled
