"""Versions, rollouts and rollback of LoRA adapter deployments through the whole
platform (`ebb up`, fake engine, whose answers start with the adapter version it ran):
each request gets the adapter of the version the split picked, billed under the
adapter's name; a new version's source is checked as at creation."""

from __future__ import annotations

import pytest
from support import wait_until
from support.billing import deploy, raw_usage
from support.lora import write_adapter

pytestmark = pytest.mark.integration

BASE = "lv-base"
ADAPTER = "lv-ad"


def _complete(admin, model: str, route_key: str = "") -> tuple[str, str]:
    """(the answer's text, the x-ebb-version it names)."""
    body = {"model": model, "prompt": "Hi", "max_tokens": 40, "temperature": 0}
    headers = {"x-ebb-route-key": route_key} if route_key else {}
    response = admin.post("/v1/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"], response.headers["x-ebb-version"]


def _versions(admin, name: str) -> dict:
    response = admin.get(f"/v1/deployments/{name}/versions")
    assert response.status_code == 200, response.text
    return response.json()


def _new_version(admin, name: str, source: str, **fields):
    return admin.post("/v1/deployments", json={"name": name, "source": source, **fields})


def _rollout(admin, name: str, **body) -> dict:
    response = admin.post(f"/v1/deployments/{name}/rollout", json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def sources(platform, admin, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-versions")
    deploy(admin, BASE, "fake://lv?ctx=1024", idle_timeout_s=600,
           engine={"enable_lora": True, "max_loras": 2})  # fmt: skip
    one, two = write_adapter(root / "one", rank=8), write_adapter(root / "two", rank=16)
    deploy(admin, ADAPTER, str(one), base=BASE)
    return one, two


def test_a_new_adapter_version_rolls_out_and_back_each_request_on_its_versions_adapter(
    admin, platform_redis, sources
):
    text, version = _complete(admin, ADAPTER)  # v1 is loaded on the base's runner
    assert text.startswith(f"[{ADAPTER}] ") and version == "1"
    response = _new_version(admin, ADAPTER, str(sources[1]))
    assert response.status_code == 201, response.text
    assert response.json()["deployed_version"] == 2 and response.json()["base"] == BASE
    assert _complete(admin, ADAPTER)[0].startswith(f"[{ADAPTER}] ")  # no traffic yet

    # An adapter has no runner of its own to warm: its rollout moves traffic at once.
    _rollout(admin, ADAPTER, strategy="immediate")
    wait_until(lambda: _versions(admin, ADAPTER)["traffic"] == {"1": 0, "2": 100}, 30,
               "the adapter's rollout")  # fmt: skip
    text, version = _complete(admin, ADAPTER)
    assert text.startswith(f"[{ADAPTER}@v2] ") and version == "2", text
    records = [r for r in raw_usage(platform_redis) if r.deployment == ADAPTER]
    assert {(r.version, r.base) for r in records} == {(1, BASE), (2, BASE)}

    back = admin.post(f"/v1/deployments/{ADAPTER}/rollback")
    assert back.status_code == 200 and back.json()["traffic"] == {"1": 100, "2": 0}, back.text
    text, version = _complete(admin, ADAPTER)
    assert text.startswith(f"[{ADAPTER}] ") and version == "1", text
    view = admin.get(f"/v1/deployments/{ADAPTER}").json()
    assert view["runners"] == [] and view["weights"] == "unknown", view
    shown = _versions(admin, ADAPTER)["data"]
    assert all(v["replicas"] == 0 and v["weights"] == "unknown" for v in shown), shown


def test_a_canary_splits_an_adapters_requests_between_its_versions(admin, sources):
    name = "lv-canary"
    deploy(admin, name, str(sources[0]), base=BASE)
    assert _new_version(admin, name, str(sources[1])).status_code == 201
    _rollout(admin, name, strategy="canary", canary_pct=50)
    wait_until(lambda: _versions(admin, name)["traffic"] == {"1": 50, "2": 50}, 30, "the canary")
    answers = [_complete(admin, name, route_key=f"user-{i}") for i in range(24)]
    prefixes = {"1": f"[{name}] ", "2": f"[{name}@v2] "}
    assert {version for _, version in answers} == {"1", "2"}
    for text, version in answers:
        assert text.startswith(prefixes[version]), (version, text)


def test_a_new_adapter_versions_source_is_checked_as_at_creation(admin, sources, tmp_path):
    wide = str(write_adapter(tmp_path / "wide", rank=64))
    response = _new_version(admin, ADAPTER, wide)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "source" and "max_lora_rank 16" in error["message"], error
    missing = tmp_path / "empty"
    missing.mkdir()
    response = _new_version(admin, ADAPTER, str(missing), base=BASE)
    assert response.status_code == 400 and response.json()["error"]["param"] == "source"
    assert wide not in {v["source"] for v in _versions(admin, ADAPTER)["data"]}


def test_a_version_keeps_its_adapters_base(admin, sources):
    deploy(admin, "lv-other", "fake://other", engine={"enable_lora": True})
    for name, base in ((ADAPTER, "lv-other"), (BASE, BASE)):
        response = _new_version(admin, name, str(sources[1]), base=base)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "base"
