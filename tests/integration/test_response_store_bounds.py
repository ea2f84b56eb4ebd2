"""What a tenant can leave in Redis through the Responses API is bounded (`ebb up`, fake
engine, a 64 MiB Redis): a stored response keeps its own turn, not the conversation
again, and nothing of what the model never reads; a tenant's stored responses are capped
(refused with what to do, room given back on delete); a refused request writes no stream
view; past the high-water mark of Redis's maxmemory tenant writes are refused while
platform state keeps its room."""

from __future__ import annotations

import json

import pytest
from support import Platform, deploy, temp_home, wait_until
from support.billing import new_key, tenant_client

from ebb.queue import keys

pytestmark = pytest.mark.integration

CAP = 12
MAXMEMORY_BYTES = 64 * 2**20
HIGH_WATER = 0.9
# Stored by the old code with every record, never tokenised.
ANNOTATIONS = [{"type": "url_citation", "title": "x" * 1_500_000}]


@pytest.fixture(scope="module")
def platform():
    env = {
        "EBB_REDIS_MAXMEMORY_BYTES": str(MAXMEMORY_BYTES),
        "EBB_REDIS_TENANT_WRITE_HIGH_WATER": str(HIGH_WATER),
        "EBB_RESPONSES_MAX_PER_TENANT": str(CAP),
        "EBB_RESPONSES_MAX_CHAIN": str(CAP),
    }
    p = Platform(home=temp_home("ebb-resp-bounds-"), redis_url=None, env_extra=env).start()
    with p.admin() as admin:
        deploy(admin, "bounded", "fake://m?ctx=4096&step_ms=1", idle_timeout_s=600)
    yield p
    assert p.stop() == 0


def _body(**fields) -> dict:
    question = "What is the capital of France?"
    return {"model": "bounded", "input": question, "max_output_tokens": 2, **fields}


def _error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def _stored_keys(client, tenant: str) -> list[bytes]:
    return list(client.scan_iter(match=keys.stored_response(tenant, "*"), count=1000))


def test_chained_responses_with_huge_annotations_keep_redis_small(platform, admin):
    redis_client = platform.redis()
    client = tenant_client(platform, new_key(admin, "chain-t"))
    used_before = redis_client.info("memory")["used_memory"]
    previous, sent_bytes, input_tokens = None, 0, []
    for turn in range(CAP):
        part = {"type": "input_text", "text": f"turn {turn}", "annotations": ANNOTATIONS}
        body = _body(input=[{"role": "user", "content": [part]}])
        if previous is not None:
            body["previous_response_id"] = previous
        sent_bytes += len(json.dumps(body))
        response = client.post("/v1/responses", json=body)
        assert response.status_code == 200, response.text
        previous = response.json()["id"]
        input_tokens.append(response.json()["usage"]["input_tokens"])
    # Each turn continued the whole conversation (its prompt grew) ...
    assert input_tokens == sorted(input_tokens) and input_tokens[-1] > input_tokens[0]
    # ... yet each record holds only its own turn, without the annotations.
    stored = _stored_keys(redis_client, "chain-t")
    assert len(stored) == CAP
    assert max(redis_client.strlen(key) for key in stored) < 64 * 1024
    grown_bytes = redis_client.info("memory")["used_memory"] - used_before
    assert grown_bytes < sent_bytes / 20, (grown_bytes, sent_bytes)
    (item,) = client.get(f"/v1/responses/{previous}/input_items").json()["data"]
    assert item["content"] == [{"type": "input_text", "text": f"turn {CAP - 1}"}]
    # The chain is as long as it may be.
    error = _error(client.post("/v1/responses", json=_body(previous_response_id=previous)), 400)
    assert (
        error["param"] == "previous_response_id" and "EBB_RESPONSES_MAX_CHAIN" in error["message"]
    )


def test_a_tenant_past_its_cap_is_refused_until_it_deletes(platform, admin):
    redis_client = platform.redis()
    client = tenant_client(platform, new_key(admin, "cap-t"))
    ids = []
    for _ in range(CAP):
        response = client.post("/v1/responses", json=_body())
        assert response.status_code == 200, response.text
        ids.append(response.json()["id"])
    for extra in ({}, {"stream": True}, {"background": True}):
        error = _error(client.post("/v1/responses", json=_body(**extra)), 403)
        assert error["code"] == "quota_exceeded" and error["param"] == "store"
        assert f"{CAP} stored responses" in error["message"]
        assert "DELETE /v1/responses/{id}" in error["message"]
        assert "store: false" in error["message"]
    # Not stored: answered as ever.
    assert client.post("/v1/responses", json=_body(store=False)).status_code == 200
    # The refusals held no room, and a delete gives its response's back.
    assert redis_client.zcard(keys.tenant_responses("cap-t")) == CAP
    assert client.delete(f"/v1/responses/{ids[0]}").status_code == 200
    assert redis_client.zcard(keys.tenant_responses("cap-t")) == CAP - 1
    assert client.post("/v1/responses", json=_body()).status_code == 200
    _error(client.post("/v1/responses", json=_body()), 403)
    # Another tenant's room is its own.
    other = tenant_client(platform, new_key(admin, "cap-other"))
    assert other.post("/v1/responses", json=_body()).status_code == 200


def test_a_chain_whose_earlier_response_was_deleted_is_refused_by_name(platform, admin):
    client = tenant_client(platform, new_key(admin, "gone-t"))
    first = client.post("/v1/responses", json=_body()).json()["id"]
    second = client.post("/v1/responses", json=_body(previous_response_id=first)).json()["id"]
    third = client.post("/v1/responses", json=_body(previous_response_id=second)).json()["id"]
    assert client.delete(f"/v1/responses/{first}").status_code == 200
    error = _error(client.post("/v1/responses", json=_body(previous_response_id=third)), 400)
    assert error["param"] == "previous_response_id"
    assert first in error["message"] and "expired or was deleted" in error["message"]
    # The later responses are still there to read.
    assert client.get(f"/v1/responses/{third}").status_code == 200


def test_refused_streams_write_no_stream_view(platform, admin):
    redis_client = platform.redis()
    client = tenant_client(platform, new_key(admin, "rpm-t", requests_per_minute=1))
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    text_format = {"type": "json_schema", "name": "a", "description": "d" * 8000, "schema": schema}
    body = _body(stream=True, text={"format": text_format})
    assert client.post("/v1/responses", json=body).status_code == 200
    for _ in range(8):
        assert _error(client.post("/v1/responses", json=body), 429)["code"]
    views = list(redis_client.scan_iter(match=keys.stream_view("rpm-t", "*"), count=1000))
    assert len(views) == 1
    # The refused ones gave back the room their storing held.
    assert redis_client.zcard(keys.tenant_responses("rpm-t")) == 1


def test_untokenised_fields_are_bounded(platform, admin):
    client = tenant_client(platform, new_key(admin, "long-t"))
    text_format = {"type": "json_schema", "name": "a", "description": "d" * 9000, "schema": {}}
    error = _error(client.post("/v1/responses", json=_body(text={"format": text_format})), 400)
    assert error["param"] == "text.format.description"
    item = {"type": "message", "role": "user", "content": "hi", "id": "i" * 300}
    assert _error(client.post("/v1/responses", json=_body(input=[item])), 400)["param"] == (
        "input.0.id"
    )
    assert _error(client.post("/v1/responses", json=_body(user="u" * 300)), 400)["param"] == "user"


def test_past_the_high_water_mark_tenant_writes_are_refused(platform, admin):
    """Filled from outside to just past 90 % of maxmemory: stored and streamed responses,
    jobs and file uploads are refused (503 storage_full), a response not stored still
    answers (platform state has its room), and once memory is back writes are taken
    again."""
    redis_client = platform.redis()
    assert redis_client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
    assert int(redis_client.config_get("maxmemory")["maxmemory"]) == MAXMEMORY_BYTES
    client = tenant_client(platform, new_key(admin, "full-t"))
    # In 1 MiB values: one large one would pass maxmemory in its query buffer alone.
    fillers = 0
    while redis_client.info("memory")["used_memory"] < MAXMEMORY_BYTES * HIGH_WATER + 2**20:
        redis_client.set(f"test:filler:{fillers}", b"f" * 2**20)
        fillers += 1
    try:
        for extra in ({}, {"stream": True, "store": False}):
            refused = wait_until(
                lambda extra=extra: _refused(client.post("/v1/responses", json=_body(**extra))),
                10,
                "a refusal past the high-water mark",
            )
            error = _error(refused, 503)
            assert error["code"] == "storage_full" and "store: false" in error["message"]
            assert refused.headers["retry-after"]
        assert client.post("/v1/responses", json=_body(store=False)).status_code == 200
        # Every other store a tenant fills is refused the same way, before it writes.
        job = {"model": "bounded", "endpoint": "completions", "body": {"prompt": "Hi"}}
        upload = {"file": ("in.jsonl", b"{}\n")}
        for refused in (
            client.post("/v1/jobs", json=job),
            client.post("/v1/files", files=upload, data={"purpose": "batch"}),
        ):
            assert _error(refused, 503)["code"] == "storage_full"
    finally:
        redis_client.delete(*(f"test:filler:{i}" for i in range(fillers)))
    wait_until(
        lambda: client.post("/v1/responses", json=_body()).status_code == 200,
        10,
        "stored responses taken again",
    )


def _refused(response):
    return response if response.status_code == 503 else None
