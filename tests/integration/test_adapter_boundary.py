"""The tenant boundary around LoRA adapters, through the whole platform (`ebb up`, fake
engine): an adapter costs at least its base (billed, budgeted), access to the base is
checked on every request, job, batch line and tokenize through an adapter, and a base's
owner reads nothing private of another tenant's adapter in its runner's logs."""

from __future__ import annotations

import json

import httpx
import pytest
from support import wait_until
from support.billing import deploy, new_key, raw_usage, tenant_client, usage_total
from support.lora import write_adapter

pytestmark = pytest.mark.integration

LORA_ON = {"engine": {"enable_lora": True, "max_loras": 2}}
# 1,000 micros a token: what the priced public base charged.
PRICED = {
    "price_per_1m_input_tokens_micros": 1_000_000_000,
    "price_per_1m_output_tokens_micros": 1_000_000_000,
}
MESSAGES = [{"role": "user", "content": "Hi"}]


def _tenant(platform, admin, name: str, sources: list[str]) -> httpx.Client:
    quota = {"max_deployments": 2, "max_replicas": 1, "max_gpus": 1, "allowed_sources": sources}
    response = admin.put(f"/v1/tenants/{name}/quota", json=quota)
    assert response.status_code == 200, response.text
    return tenant_client(platform, new_key(admin, name))


def _chat(client: httpx.Client, model: str) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 4, "temperature": 0}
    return client.post("/v1/chat/completions", json=body)


def _adapter(client: httpx.Client, name: str, base: str, source: str) -> dict:
    response = client.post("/v1/deployments", json={"name": name, "base": base, "source": source})
    assert response.status_code == 201, response.text
    return response.json()


def _record(platform_redis, request_id: str):
    def found():
        return next((r for r in raw_usage(platform_redis) if r.request_id == request_id), None)

    return wait_until(found, 30, f"the usage record of {request_id}")


def test_a_tenants_adapter_pays_its_bases_prices_and_its_budget_holds(
    platform, admin, platform_redis, tmp_path
):
    deploy(admin, "pub", "fake://pub?ctx=1024", idle_timeout_s=600, **LORA_ON, **PRICED)
    beta = _tenant(platform, admin, "beta", [str(tmp_path)])
    view = _adapter(beta, "beta-free", "pub", str(write_adapter(tmp_path / "a1")))
    # Created at its base's prices, not at 0 (a tenant may not set prices).
    assert view["price_per_1m_input_tokens_micros"] == 1_000_000_000, view
    assert view["price_per_1m_output_tokens_micros"] == 1_000_000_000, view

    answer = _chat(beta, "beta-free")
    assert answer.status_code == 200, answer.text
    record = _record(platform_redis, answer.json()["id"])
    assert (record.deployment, record.base) == ("beta-free", "pub")
    assert record.price_per_1m_input_tokens_micros == 1_000_000_000
    assert record.price_per_1m_output_tokens_micros == 1_000_000_000

    # The base's price raised later: the adapter's requests pay the new one too.
    raised = admin.patch(
        "/v1/deployments/pub", json={"price_per_1m_output_tokens_micros": 3 * 10**9}
    )
    assert raised.status_code == 200, raised.text
    again = _chat(beta, "beta-free")
    assert again.status_code == 200, again.text
    assert (
        _record(platform_redis, again.json()["id"]).price_per_1m_output_tokens_micros == 3 * 10**9
    )

    # A tenant at its budget is refused on the adapter as on the base.
    budget = {"budget": {"amount_micros": 1000, "period": None}}
    assert admin.put("/v1/tenants/beta/limits", json=budget).status_code == 200
    for model in ("pub", "beta-free"):
        refused = _chat(beta, model)
        assert refused.status_code == 429, (model, refused.text)
        assert refused.json()["error"]["code"] == "insufficient_quota"
    job = {"model": "beta-free", "endpoint": "chat.completions", "body": {"messages": MESSAGES}}
    response = {"model": "beta-free", "input": "Hi", "max_output_tokens": 4}
    for refused in (beta.post("/v1/jobs", json=job), beta.post("/v1/responses", json=response)):
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "insufficient_quota"
    batch = _batch(beta, "beta-free")
    assert batch["request_counts"]["failed"] == 1, batch
    errors = beta.get(f"/v1/files/{batch['error_file_id']}/content").text
    assert "insufficient_quota" in errors, errors

    # The base's GPU time, shared among the adapters it served by tokens, in the usage.
    def split() -> list[dict] | None:
        rows = usage_total(admin)["adapter_gpu"]
        mine = [r for r in rows if r["base"] == "pub" and r["adapter"] == "beta-free"]
        return rows if mine and mine[0]["gpu_ms"] > 0 else None

    rows = [r for r in wait_until(split, 60, "pub's GPU time split") if r["base"] == "pub"]
    assert {(r["adapter"], r["adapter_owner"]) for r in rows} <= {
        (None, None),
        ("beta-free", "beta"),
    }
    pub = usage_total(admin, tenant="admin", group_by="deployment")["gpu_costs"]
    metered = sum(r["gpu_ms"] for r in pub if r["deployment"] == "pub")
    assert sum(r["gpu_ms"] for r in rows) <= metered  # read a moment later: it only grows
    assert usage_total(beta)["adapter_gpu"] == []  # not beta's GPUs

    # The admin may price an adapter below its base: then its own prices apply.
    cheap = {"price_per_1m_input_tokens_micros": 5, "price_per_1m_output_tokens_micros": 5}
    assert admin.patch("/v1/deployments/beta-free", json=cheap).status_code == 200
    assert admin.put("/v1/tenants/beta/limits", json={"budget": None}).status_code == 200
    priced = _chat(beta, "beta-free")
    assert priced.status_code == 200, priced.text
    assert _record(platform_redis, priced.json()["id"]).price_per_1m_input_tokens_micros == 5


def _batch(client: httpx.Client, model: str) -> dict:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": MESSAGES, "max_tokens": 4}}  # fmt: skip
    uploaded = client.post(
        "/v1/files",
        files={"file": ("in.jsonl", json.dumps(line).encode() + b"\n")},
        data={"purpose": "batch"},
    )
    assert uploaded.status_code == 200, uploaded.text
    body = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions",
            "completion_window": "24h"}  # fmt: skip
    created = client.post("/v1/batches", json=body)
    assert created.status_code == 200, created.text

    def settled() -> dict | None:
        batch = client.get(f"/v1/batches/{created.json()['id']}").json()
        return batch if batch["status"] in ("completed", "failed", "expired") else None

    return wait_until(settled, 60, "the batch to settle")


def test_an_adapter_loses_its_base_when_access_to_the_base_is_taken_away(platform, admin, tmp_path):
    deploy(admin, "acme-lora", "fake://acme?ctx=1024", idle_timeout_s=600,
           visibility="private", shared_with=["beta7"], **LORA_ON)  # fmt: skip
    beta = _tenant(platform, admin, "beta7", [str(tmp_path)])
    _adapter(beta, "beta7-ad", "acme-lora", str(write_adapter(tmp_path / "a7")))
    assert _chat(beta, "beta7-ad").status_code == 200
    tokenize = {"model": "beta7-ad", "prompt": "Hello"}
    assert beta.post("/tokenize", json=tokenize).status_code == 200

    unshared = admin.patch("/v1/deployments/acme-lora", json={"shared_with": []})
    assert unshared.status_code == 200, unshared.text
    assert _chat(beta, "acme-lora").status_code == 404  # directly: as before
    for response in (
        _chat(beta, "beta7-ad"),
        beta.post("/tokenize", json=tokenize),
        beta.post("/detokenize", json={"model": "beta7-ad", "tokens": [1, 2]}),
        beta.post(
            "/v1/jobs",
            json={
                "model": "beta7-ad",
                "endpoint": "chat.completions",
                "body": {"messages": MESSAGES},
            },
        ),  # fmt: skip
    ):
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert (
            error["code"] == "model_not_found" and "no longer one you may call" in error["message"]
        )
    batch = _batch(beta, "beta7-ad")
    assert batch["request_counts"] == {"total": 1, "completed": 0, "failed": 1}, batch
    errors = beta.get(f"/v1/files/{batch['error_file_id']}/content").text
    assert "no longer one you may call" in errors, errors


def test_a_bases_owner_reads_nothing_private_of_anothers_adapter_in_its_logs(
    platform, admin, tmp_path
):
    owner = _tenant(platform, admin, "logbase", ["fake://"])
    created = owner.post(
        "/v1/deployments",
        json={
            "name": "logbase-m",
            "source": "fake://lb9?ctx=1024",
            "idle_timeout_s": 600,
            **LORA_ON,
        },  # fmt: skip
    )
    assert created.status_code == 201, created.text
    assert admin.patch("/v1/deployments/logbase-m", json={"shared_with": ["logad"]}).is_success
    source_dir = tmp_path / "logad-secret-src"
    adapter_owner = _tenant(platform, admin, "logad", [str(tmp_path)])
    adapter = _adapter(adapter_owner, "logad-secret", "logbase-m", str(write_adapter(source_dir)))
    assert _chat(adapter_owner, "logad-secret").status_code == 200

    def lines() -> str | None:
        response = owner.get("/v1/logs", params={"deployment": "logbase-m", "tail": 10_000})
        assert response.status_code == 200, response.text
        text = "\n".join(line["line"] for line in response.json()["data"])
        return text if "runner: adapter " in text else None

    text = wait_until(lines, 30, "the runner's line about the adapter")
    assert f"runner: adapter {adapter['uid']} ready" in text, text  # named by its identity
    assert "logad-secret" not in text, text
    assert str(source_dir) not in text, text
