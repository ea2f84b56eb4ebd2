"""A tenant's chat template costs nobody else anything (`ebb up`, fake engine): a template
that would loop for ever (three nested loops over range(15000), issue 46) renders off the
event loop and stops at its budget with a 400 for its own request, while another tenant's
requests keep answering during it; a template that does not compile is refused when
deployed."""

from __future__ import annotations

import threading

import httpx
import pytest
from support import Platform, deploy, temp_home, wait_until
from support.billing import new_key, tenant_client

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
FOREVER = (
    "{% for i in range(15000) %}{% for j in range(15000) %}{% for k in range(15000) %}"
    "{% endfor %}{% endfor %}{% endfor %}"
)
# Stopped by the clock (steps far beyond it), so that the render is in flight for a while.
ENV = {"EBB_CHAT_TEMPLATE_MAX_STEPS": str(10**12), "EBB_CHAT_TEMPLATE_TIMEOUT_S": "5"}


@pytest.fixture(scope="module")
def platform():
    p = Platform(home=temp_home("ebb-templates-"), redis_url=None, env_extra=ENV).start()
    with p.admin() as admin:
        deploy(admin, "calm-m", "fake://m?step_ms=1", idle_timeout_s=120)
        quota = {"max_deployments": 2, "max_replicas": 2, "max_gpus": 2,
                 "allowed_sources": ["fake://"]}  # fmt: skip
        assert admin.put("/v1/tenants/evil/quota", json=quota).status_code == 200
    yield p
    assert p.stop() == 0


def _chat(client: httpx.Client, model: str) -> httpx.Response:
    return client.post(
        "/v1/chat/completions", json={"model": model, "messages": MESSAGES, "max_tokens": 2}
    )


def test_a_hostile_template_is_a_400_for_its_caller_and_nothing_for_others(platform, admin):
    evil = tenant_client(platform, new_key(admin, "evil"))
    calm = tenant_client(platform, new_key(admin, "calm"))
    body = {"name": "evil-tpl", "source": "fake://m?step_ms=1",
            "serving": {"chat_template": FOREVER}}  # fmt: skip
    assert evil.post("/v1/deployments", json=body).status_code == 201
    wait_until(lambda: _chat(calm, "calm-m").status_code == 200, 60, "calm-m to answer")

    hostile: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: hostile.append(_chat(evil, "evil-tpl")))
    thread.start()
    during: list[int] = []
    try:
        while thread.is_alive():
            for response in (calm.get("/v1/models"), _chat(calm, "calm-m")):
                if thread.is_alive():  # answered while the hostile render was in flight
                    during.append(response.status_code)
    finally:
        thread.join()

    [refused] = hostile
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "chat_template_budget" and error["param"] == "messages"
    assert "exceeded its render budget" in error["message"]
    assert len(during) >= 3 and set(during) == {200}, during
    # And the same for /tokenize, which renders the same template.
    tokenized = evil.post("/tokenize", json={"model": "evil-tpl", "messages": MESSAGES})
    assert tokenized.status_code == 400 and tokenized.json()["error"]["code"] == (
        "chat_template_budget"
    )


@pytest.mark.parametrize(
    ("how", "template"),
    [("unclosed block", "{% for m in messages %}\n{{ m.content }}\n{% endfor %"),
     ("unknown filter", "{{ messages | batch(3) }}")],
)  # fmt: skip
def test_a_template_that_does_not_compile_is_refused_when_deployed(platform, admin, how, template):
    evil = tenant_client(platform, new_key(admin, "evil"))
    body = {"name": "evil-broken", "source": "fake://m", "serving": {"chat_template": template}}
    refused = evil.post("/v1/deployments", json=body)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "serving.chat_template" and "line" in error["message"], error
    assert evil.get("/v1/deployments/evil-broken").status_code == 404
    # Nor on a deployment that exists: a PATCH, or a new version.
    fine = {**body, "serving": {"chat_template": "{{ messages[0].content }}"}}
    assert evil.post("/v1/deployments", json=fine).status_code == 201
    patch = evil.patch("/v1/deployments/evil-broken", json={"serving": body["serving"]})
    assert patch.status_code == 400 and patch.json()["error"]["param"] == "serving.chat_template"
    version = evil.post("/v1/deployments", json=body)
    assert version.status_code == 400, version.text
    assert version.json()["error"]["param"] == "serving.chat_template"
    kept = admin.get("/v1/deployments/evil-broken").json()["serving"]["chat_template"]
    assert kept == "{{ messages[0].content }}"
    assert evil.delete("/v1/deployments/evil-broken").status_code == 200
