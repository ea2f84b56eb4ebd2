"""Tenant self-service through the whole platform (`ebb up`, fake engine): a tenant deploys
within the quota the admin set and pays for its GPU time; it cannot see, change, call (and
so bill against) another tenant's deployment, nor pass its quota; refusals say which limit
and how to change it."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from support import Platform, wait_until
from support.billing import new_key, tenant_client, usage_total

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def tenant(platform: Platform, admin: httpx.Client, name: str) -> httpx.Client:
    return tenant_client(platform, new_key(admin, name))


def set_quota(admin: httpx.Client, tenant_name: str, **quota) -> dict:
    response = admin.put(f"/v1/tenants/{tenant_name}/quota", json=quota)
    assert response.status_code == 200, response.text
    return response.json()


def chat(client: httpx.Client, model: str) -> httpx.Response:
    return client.post(
        "/v1/chat/completions", json={"model": model, "messages": MESSAGES, "max_tokens": 4}
    )


def refusal(response: httpx.Response, status: int, param: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    return error["message"]


def test_a_tenant_deploys_within_its_quota_and_pays_for_its_gpu_time(platform, admin):
    set_quota(admin, "acme", max_deployments=2, max_replicas=3, max_gpus=3,
              allowed_sources=["fake://"])  # fmt: skip
    acme = tenant(platform, admin, "acme")
    created = acme.post(
        "/v1/deployments",
        json={"name": "acme-a", "source": "fake://a", "max_replicas": 2, "idle_timeout_s": 1},
    )
    assert created.status_code == 201, created.text
    # Its own: owned by it (billed its GPU time), private, and shown whole to it.
    view = created.json()
    assert (view["owner"], view["visibility"], view["source"]) == ("acme", "private", "fake://a")
    quota = acme.get("/v1/tenants/acme/quota").json()
    assert quota["use"] == {"deployments": 1, "replicas": 2, "gpus": 2}
    assert quota["max_replicas"] == 3

    assert chat(acme, "acme-a").status_code == 200
    scaled = acme.patch("/v1/deployments/acme-a", json={"max_replicas": 3, "idle_timeout_s": 1})
    assert scaled.status_code == 200 and scaled.json()["max_replicas"] == 3
    usage = wait_until(
        lambda: (u := usage_total(acme))["total"]["gpu_ms"] > 0 and u,
        60,
        "acme-a's runner's GPU time in acme's usage",
    )
    assert [row["deployment"] for row in usage["data"]] == ["acme-a"]
    assert usage["total"]["completion_tokens"] == 4
    # Nothing of it went to the platform's own tenant.
    admins = usage_total(admin, tenant="admin", group_by="deployment")
    assert "acme-a" not in [row["deployment"] for row in admins["data"]]

    assert acme.delete("/v1/deployments/acme-a").json()["deleted"] is True
    assert acme.get("/v1/tenants/acme/quota").json()["use"]["deployments"] == 0


def test_quota_refusals_name_the_limit_and_how_to_raise_it(platform, admin):
    client = tenant(platform, admin, "quota-t")
    body = {"name": "quota-t-a", "source": "fake://ok/a"}
    none_yet = refusal(client.post("/v1/deployments", json=body), 403, "max_deployments")
    assert "no deployment quota" in none_yet and "ebb tenants quota quota-t" in none_yet

    set_quota(admin, "quota-t", max_deployments=1, max_replicas=2, max_gpus=2,
              allowed_sources=["fake://ok/"])  # fmt: skip
    outside = client.post("/v1/deployments", json={**body, "source": "fake://other"})
    message = refusal(outside, 403, "source")
    assert "only sources starting with 'fake://ok/'" in message and "--allow-source" in message
    assert outside.json()["error"]["code"] == "quota_exceeded"

    too_many = refusal(client.post("/v1/deployments", json={**body, "max_replicas": 3}), 403,
                       "max_replicas")  # fmt: skip
    assert "up to 3 replicas" in too_many and "its quota is 2" in too_many
    assert "--max-replicas" in too_many

    assert client.post("/v1/deployments", json=body).status_code == 201
    second = refusal(client.post("/v1/deployments", json={**body, "name": "quota-t-b"}), 403,
                     "max_deployments")  # fmt: skip
    assert "at most 1 deployments and owns 1" in second
    assert refusal(client.patch("/v1/deployments/quota-t-a", json={"max_replicas": 3}), 403,
                   "max_replicas")  # fmt: skip

    set_quota(admin, "quota-t", max_deployments=1, max_replicas=4, max_gpus=2,
              allowed_sources=["fake://ok/"])  # fmt: skip
    gpus = refusal(
        client.patch("/v1/deployments/quota-t-a", json={"max_replicas": 3}), 403, "max_gpus"
    )
    assert "up to 3 GPUs" in gpus and "--max-gpus" in gpus

    # Prices, owner, sharing are the admin's.
    price = client.patch("/v1/deployments/quota-t-a", json={"price_per_1m_input_tokens_micros": 0})
    assert "set by the admin" in refusal(price, 403, "price_per_1m_input_tokens_micros")
    assert refusal(client.patch("/v1/deployments/quota-t-a", json={"owner": "someone-else"}), 403,
                   "owner")  # fmt: skip
    assert refusal(client.patch("/v1/deployments/quota-t-a", json={"shared_with": ["x"]}), 403,
                   "shared_with")  # fmt: skip

    # A quota lowered below what the tenant uses removes nothing: it may scale down and
    # delete, never up.
    set_quota(admin, "quota-t", max_deployments=0, max_replicas=0)
    down = client.patch("/v1/deployments/quota-t-a", json={"max_replicas": 1})
    assert down.status_code == 200, down.text
    assert refusal(client.patch("/v1/deployments/quota-t-a", json={"max_replicas": 2}), 403,
                   "max_replicas")  # fmt: skip
    assert client.delete("/v1/deployments/quota-t-a").status_code == 200


def test_concurrent_creates_cannot_pass_the_quota_together(platform, admin):
    set_quota(admin, "race-t", max_deployments=1, max_replicas=8, max_gpus=8, allowed_sources=["*"])
    key = new_key(admin, "race-t")

    def create(i: int) -> int:
        with tenant_client(platform, key) as client:
            body = {"name": f"race-t-{i}", "source": "fake://r"}
            return client.post("/v1/deployments", json=body).status_code

    with ThreadPoolExecutor(6) as pool:
        codes = sorted(pool.map(create, range(6)))
    assert codes == [201, 403, 403, 403, 403, 403]
    owned = [d for d in admin.get("/v1/deployments").json()["data"] if d["owner"] == "race-t"]
    assert len(owned) == 1


def test_tenants_cannot_see_change_or_call_each_others_deployments(platform, admin):
    set_quota(
        admin, "own-t", max_deployments=2, max_replicas=2, max_gpus=2, allowed_sources=["fake://"]
    )
    own, other = tenant(platform, admin, "own-t"), tenant(platform, admin, "other-t")
    created = own.post("/v1/deployments", json={"name": "own-t-p", "source": "fake://p"})
    assert created.status_code == 201, created.text

    # Another tenant: it does not exist (404s, never a 403 that would confirm the name).
    assert "own-t-p" not in [d["name"] for d in other.get("/v1/deployments").json()["data"]]
    assert "own-t-p" not in [m["id"] for m in other.get("/v1/models").json()["data"]]
    assert refusal(other.get("/v1/deployments/own-t-p"), 404, "name")
    assert refusal(other.get("/v1/models/own-t-p"), 404, "model")
    call = chat(other, "own-t-p")
    assert refusal(call, 404, "model") and call.json()["error"]["code"] == "model_not_found"
    job = other.post("/v1/jobs", json={"model": "own-t-p", "endpoint": "chat.completions",
                                       "body": {"messages": MESSAGES}})  # fmt: skip
    assert refusal(job, 404, "model")
    assert other.patch("/v1/deployments/own-t-p", json={"max_replicas": 1}).status_code == 404
    assert other.delete("/v1/deployments/own-t-p").status_code == 404
    assert usage_total(other)["total"]["requests"] == 0, "a refused call bills nothing"

    # Shared by the admin: the other tenant calls it (paying its tokens, the owner keeps the
    # GPU time) and sees what a caller sees, but cannot change it.
    shared = admin.patch("/v1/deployments/own-t-p", json={"shared_with": ["other-t"]})
    assert shared.status_code == 200 and shared.json()["shared_with"] == ["other-t"]
    seen = other.get("/v1/deployments/own-t-p").json()
    assert seen["status"] and "source" not in seen and "owner" not in seen
    assert chat(other, "own-t-p").status_code == 200
    tokens = usage_total(other)["total"]
    assert (tokens["requests"], tokens["completion_tokens"]) == (1, 4)
    change = other.patch("/v1/deployments/own-t-p", json={"max_replicas": 1})
    assert "belongs to another tenant" in change.json()["error"]["message"]
    assert change.status_code == 403
    assert other.delete("/v1/deployments/own-t-p").status_code == 403

    # The admin's deployments stay public: every tenant calls them, none changes them.
    admin.post("/v1/deployments", json={"name": "platform-m", "source": "fake://m"})
    assert chat(other, "platform-m").status_code == 200
    assert own.patch("/v1/deployments/platform-m", json={"max_replicas": 2}).status_code == 403
    assert own.delete("/v1/deployments/platform-m").status_code == 403
    # ... and the admin keeps everything: it sees, changes and deletes the tenant's.
    assert admin.get("/v1/deployments/own-t-p").json()["source"] == "fake://p"
    assert admin.delete("/v1/deployments/own-t-p").status_code == 200


def test_a_tenant_reads_only_its_own_quota_and_the_admin_lists_them(platform, admin):
    set_quota(admin, "list-t", max_deployments=3, allowed_sources=["hf://list-t/"])
    client = tenant(platform, admin, "list-t")
    assert client.get("/v1/tenants/list-t/quota").json()["max_deployments"] == 3
    assert refusal(client.get("/v1/tenants/acme/quota"), 403, "tenant")
    assert client.put("/v1/tenants/list-t/quota", json={"max_deployments": 9}).status_code == 403
    tenants = {t["tenant"]: t for t in admin.get("/v1/tenants").json()["data"]}
    assert tenants["list-t"]["quota"]["allowed_sources"] == ["hf://list-t/"]
    # The admin key's own tenant is not one a key can be made for.
    refused = admin.post("/v1/keys", json={"tenant": "admin"})
    assert refused.status_code == 400 and "admin key's own tenant" in refused.text


def test_a_tenant_reads_the_logs_of_its_own_deployments_only(platform, admin):
    set_quota(admin, "logs-t", max_deployments=1, max_replicas=1, max_gpus=1,
              allowed_sources=["fake://"])  # fmt: skip
    own, other = tenant(platform, admin, "logs-t"), tenant(platform, admin, "logs-o")
    assert (
        own.post("/v1/deployments", json={"name": "logs-t-d", "source": "fake://l"}).status_code
        == 201
    )
    assert chat(own, "logs-t-d").status_code == 200
    [runner] = own.get("/v1/deployments/logs-t-d").json()["runners"]
    lines = own.get("/v1/logs", params={"deployment": "logs-t-d"})
    assert lines.status_code == 200, lines.text
    assert any(runner["id"] in line["source"] for line in lines.json()["data"])
    assert refusal(own.get("/v1/logs"), 403, "deployment")  # the platform's: the admin's
    assert refusal(other.get("/v1/logs", params={"deployment": "logs-t-d"}), 404, "name")
    theirs = own.get("/v1/logs", params={"deployment": "logs-t-d", "runner": "not-mine"})
    assert refusal(theirs, 404, "runner")


def test_a_tenant_reads_the_controllers_decisions_about_its_own_deployment_only(platform, admin):
    clients = {}
    for name in ("dec-t", "dec-o"):
        set_quota(admin, name, max_deployments=1, max_replicas=1, max_gpus=1,
                  allowed_sources=["fake://"])  # fmt: skip
        clients[name] = tenant(platform, admin, name)
        created = clients[name].post(
            "/v1/deployments", json={"name": f"{name}-d", "source": f"fake://{name}"}
        )
        assert created.status_code == 201, created.text
        assert chat(clients[name], f"{name}-d").status_code == 200

    def decisions(name: str) -> list[dict]:
        lines = clients[name].get("/v1/logs", params={"deployment": f"{name}-d"})
        assert lines.status_code == 200, lines.text
        data = lines.json()["data"]
        return [json.loads(x["line"]) for x in data if x["source"].startswith("decisions-")]

    [decided, *_] = wait_until(lambda: decisions("dec-t"), 30, "the decision that started it")
    assert decided["deployment"] == "dec-t-d" and decided["queue"]["requests"] >= 1
    assert {a["action"] for a in decided["actions"]} & {"AssignStem", "Launch", "WakeSleeper"}
    own_text = json.dumps(decisions("dec-t"))
    assert "dec-o" not in own_text, "another tenant's names never reach a tenant"
