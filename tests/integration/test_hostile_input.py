"""Hostile input and least exposure, through HTTP against the whole platform (fake engine).

Every route that takes a body reads it one way: bounded (413 while reading), strict JSON
(no lone surrogates), bounded depth; every refusal is in the OpenAI error shape and none
is a 5xx. Jobs obey the same rate limits as synchronous requests; tenants see only what
they may; /metrics and the API schema are not public.
"""

from __future__ import annotations

import itertools
import json
import select
import socket

import httpx
import pytest
from support import Platform, deploy, temp_home, wait_until
from support.lora import write_adapter
from support.platform_processes import processes

from ebb.queue import keys

pytestmark = pytest.mark.integration

METRICS_TOKEN = "metrics-" + "t" * 24
LIMIT_BYTES = 256 * 1024
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
CHAT = {"model": "hostile", "messages": MESSAGES, "max_tokens": 4}
RESPONSE = {
    "model": "hostile",
    "input": "Paris is",
    "max_output_tokens": 4,
    "user": "u-1",
    "text": {"format": {"type": "text"}},
}

# (method, path, a valid body): every route that takes a body.
BODY_ROUTES = [
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"model": "hostile", "prompt": "Paris is", "max_tokens": 4}),
    ("POST", "/v1/jobs", {"model": "hostile", "endpoint": "chat.completions", "body": CHAT}),
    ("POST", "/v1/responses", RESPONSE),
    ("POST", "/v1/deployments", {"name": "made-by-fuzz", "source": "fake://m"}),
    ("PATCH", "/v1/deployments/hostile", {"max_replicas": 1}),
    ("POST", "/v1/keys", {"tenant": "fuzz", "name": "k"}),
    ("PUT", "/v1/tenants/fuzz/limits", {"requests_per_minute": 1000}),
    ("PUT", "/v1/tenants/fuzz/quota", {"max_deployments": 1, "allowed_sources": ["fake://"]}),
    ("PUT", "/v1/keys/key_000000000000/limits", {"requests_per_minute": 1000}),
    ("POST", "/v1/webhooks/secret/rotate", {"overlap_s": 10}),
    ("POST", "/tokenize", {"model": "hostile", "prompt": "Paris is"}),
    ("POST", "/tokenize", {"model": "hostile", "messages": MESSAGES}),
    ("POST", "/detokenize", {"model": "hostile", "tokens": [80, 97]}),
]
_ROUTE_IDS = [f"{m} {p}" for m, p, _ in BODY_ROUTES]


@pytest.fixture(scope="module")
def platform():
    p = Platform(
        home=temp_home("ebb-hostile-"),
        redis_url=None,
        env_extra={"EBB_METRICS_TOKEN": METRICS_TOKEN, "EBB_MAX_BODY_BYTES": str(LIMIT_BYTES)},
    ).start()
    with p.admin() as admin:
        deploy(admin, "hostile", "fake://m?step_ms=1", idle_timeout_s=120)
    yield p
    assert p.stop() == 0


@pytest.fixture(scope="module")
def tenant(platform, admin):
    created = admin.post("/v1/keys", json={"tenant": "acme", "name": "hostile"}).json()
    with httpx.Client(
        base_url=platform.base_url,
        timeout=60,
        headers={"Authorization": f"Bearer {created['key']}"},
    ) as client:
        yield client


def _assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] not in (None, "internal_error"), error
    return error


def _raw_request(platform: Platform, head: bytes, body_chunks) -> tuple[bytes, int]:
    """Send a request over a plain socket; (what the server answered, body bytes sent
    before it answered or closed). The answer may be lost (b"") when the server closes with
    our unread bytes in its buffer: its kernel then resets the connection."""
    sent = 0
    received = b""
    with socket.create_connection(("127.0.0.1", platform.port), timeout=30) as sock:
        sock.sendall(head)
        try:
            for chunk in body_chunks:
                if select.select([sock], [], [], 0)[0]:  # the server answered (or closed)
                    break
                sock.sendall(chunk)
                sent += len(chunk)
            while piece := sock.recv(65536):
                received += piece
        except (BrokenPipeError, ConnectionResetError):
            pass
    return received, sent


def _refusals_413(admin) -> float:
    lines = admin.get("/metrics").text.splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("ebb_http_requests_total{") and 'status="413"' in line
    )


def _head(platform: Platform, extra: str) -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {platform.admin_key}\r\nContent-Type: application/json\r\n"
        f"{extra}\r\n"
    ).encode()


def _frontdoor_rss_bytes(platform: Platform) -> int:
    [frontdoor] = processes(platform.home, "frontdoor")
    return frontdoor.memory_info().rss


def test_a_50mb_body_is_refused_while_read_and_never_held(platform, admin):
    rss_before = _frontdoor_rss_bytes(platform)
    refused_before = _refusals_413(admin)
    declared, _ = _raw_request(platform, _head(platform, "Content-Length: 50000000\r\n"), [])
    assert declared.startswith(b"HTTP/1.1 413 ") and b"request_too_large" in declared

    def chunked():  # 50 MB, if the server kept reading
        piece = b"x" * 65536
        for _ in range(800):
            yield b"%x\r\n%s\r\n" % (len(piece), piece)

    answer, sent = _raw_request(
        platform, _head(platform, "Transfer-Encoding: chunked\r\n"), chunked()
    )
    assert answer == b"" or answer.startswith(b"HTTP/1.1 413 ")
    assert sent < 50_000_000 // 2, "the server read on past its limit"
    # Both were answered 413 (the second answer may not reach a client that kept sending).
    assert _refusals_413(admin) - refused_before == 2
    # The body was never buffered whole: memory grew by far less than 50 MB.
    assert _frontdoor_rss_bytes(platform) - rss_before < 20 * 2**20


@pytest.mark.parametrize(("method", "path", "valid"), BODY_ROUTES, ids=_ROUTE_IDS)
def test_every_route_refuses_oversize_deep_and_invalid_text(admin, method, path, valid):
    big = {**valid, "pad": "x" * LIMIT_BYTES}
    _assert_openai_error(admin.request(method, path, json=big), 413)
    deep = b"[" * 100_000 + b"]" * 100_000  # within the size limit
    assert (
        "nested" in _assert_openai_error(admin.request(method, path, content=deep), 400)["message"]
    )
    for raw in (b'{"name": "\\ud800"}', b'{"name": "\xff"}', b"{not json", b'{"a": 1'):
        error = _assert_openai_error(
            admin.request(method, path, content=raw, headers={"content-type": "application/json"}),
            400,
        )
        assert error["code"] == "invalid_json" and error["param"] is None


def test_a_json_schema_5000_levels_deep_is_refused(admin):
    # Spelled as text: encoding it with json would overflow the test's own stack.
    schema = '{"type": "object", "properties": {"a": ' * 5000 + '{"type": "object"}' + "}}" * 5000
    body = json.dumps({**CHAT, "response_format": {"type": "json_schema", "json_schema": {}}})
    body = body.replace('"json_schema": {}', f'"json_schema": {{"name": "d", "schema": {schema}}}')
    response = admin.post("/v1/chat/completions", content=body.encode())
    error = _assert_openai_error(response, 400)
    assert error["code"] == "json_too_deep"


def _hostile_bodies(valid: dict):
    """Wrong types, nulls and odd values for every field of a valid body, and wrong roots."""
    yield from ([], "text", 7, None, True, [valid])
    odd_values = (None, "", "x" * 5000, -1, 2**70, 1.5, True, [], {}, [None], {"a": None})
    for name, value in itertools.product(valid, odd_values):
        yield {**valid, name: value}
    yield {**valid, "unknown_field": 1}
    yield {k: v for k, v in valid.items() if k != next(iter(valid))}


@pytest.mark.parametrize(("method", "path", "valid"), BODY_ROUTES, ids=_ROUTE_IDS)
def test_hostile_bodies_never_get_a_5xx(admin, tenant, method, path, valid):
    for body in _hostile_bodies(valid):
        for client in (admin, tenant):
            response = client.request(method, path, json=body)
            assert response.status_code < 500, (body, response.text)
            if response.status_code >= 400:
                _assert_openai_error(response, response.status_code)


def test_null_fields_sdks_send_are_accepted(admin):
    nulls = {"stop": None, "temperature": None, "seed": None, "user": None, "n": None}
    chat = admin.post("/v1/chat/completions", json={**CHAT, **nulls})
    assert chat.status_code == 200, chat.text
    completion = admin.post(
        "/v1/completions", json={"model": "hostile", "prompt": "Paris", "max_tokens": 3, **nulls}
    )
    assert completion.status_code == 200, completion.text
    job = admin.post(
        "/v1/jobs",
        json={
            "model": "hostile",
            "endpoint": "chat.completions",
            "body": {**CHAT, **nulls},
            "webhook": None,
            "metadata": None,
            "ttl_s": None,
        },
    )
    assert job.status_code == 202, job.text
    done = wait_until(
        lambda: (
            (v := admin.get(f"/v1/jobs/{job.json()['id']}").json())["status"]
            in ("succeeded", "failed")
            and v
        ),
        60,
        "the job to finish",
    )
    assert done["status"] == "succeeded"


def test_route_and_method_errors_have_codes(admin):
    assert _assert_openai_error(admin.get("/v1/nothing-here"), 404)["code"] == "not_found"
    wrong_method = admin.put("/v1/chat/completions", json=CHAT)
    assert _assert_openai_error(wrong_method, 405)["code"] == "method_not_allowed"
    bad_query = admin.get("/v1/jobs", params={"limit": "many"})
    assert _assert_openai_error(bad_query, 400)["param"] == "limit"
    bad_field = admin.post("/v1/keys", json={"tenant": "ok", "name": 5})
    assert _assert_openai_error(bad_field, 400)["param"] == "name"
    nested = admin.post(
        "/v1/jobs",
        json={
            "model": "hostile",
            "endpoint": "chat.completions",
            "body": CHAT,
            "webhook": {"url": "x" * 3000},
        },
    )
    assert _assert_openai_error(nested, 400)["param"] == "webhook.url"


def test_deployment_source_is_bounded(admin):
    long = admin.post(
        "/v1/deployments", json={"name": "long-src", "source": "fake://" + "m" * 5000}
    )
    assert _assert_openai_error(long, 400)["param"] == "source"


def test_embedded_loopback_webhook_is_refused(admin):
    response = admin.post(
        "/v1/jobs",
        json={
            "model": "hostile",
            "endpoint": "chat.completions",
            "body": CHAT,
            "webhook": {"url": "http://[2002:7f00:1::]:8080/hook"},
        },
    )
    error = _assert_openai_error(response, 400)
    assert error["code"] == "unsafe_webhook_url" and "127.0.0.1" in error["message"]


def _job(client: httpx.Client, **body) -> httpx.Response:
    return client.post(
        "/v1/jobs",
        json={"model": "hostile", "endpoint": "chat.completions", "body": {**CHAT, **body}},
    )


def test_jobs_count_against_requests_per_minute(platform, admin):
    created = admin.post("/v1/keys", json={"tenant": "rpm-jobs", "requests_per_minute": 3}).json()
    headers = {"Authorization": f"Bearer {created['key']}"}
    with httpx.Client(base_url=platform.base_url, timeout=60, headers=headers) as client:
        assert [_job(client).status_code for _ in range(3)] == [202, 202, 202]
        refused = _job(client)
        error = _assert_openai_error(refused, 429)
        assert error["code"] == "rate_limit_exceeded"
        assert int(refused.headers["retry-after"]) >= 1
        # Synchronous requests share the same bucket.
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 429


def test_a_finished_job_gives_back_the_tokens_it_did_not_use(platform, admin):
    created = admin.post("/v1/keys", json={"tenant": "tpm-jobs", "tokens_per_minute": 1000}).json()
    headers = {"Authorization": f"Bearer {created['key']}"}
    # Reserves the prompt + 900 tokens; stops after a few (at "Paris").
    heavy = {"max_tokens": 900, "stop": ["Paris"]}
    with httpx.Client(base_url=platform.base_url, timeout=60, headers=headers) as client:
        first = _job(client, **heavy)
        assert first.status_code == 202, first.text
        assert _job(client, **heavy).status_code == 429  # the bucket holds < 900 now
        wait_until(
            lambda: client.get(f"/v1/jobs/{first.json()['id']}").json()["status"] == "succeeded",
            60,
            "the first job to finish",
        )
        # Refilling alone would take ~50 s; the settled job gave back ~850 tokens.
        wait_until(lambda: _job(client, **heavy).status_code == 202, 10, "the give-back")


def test_a_job_that_never_ran_gives_back_its_request(platform, admin):
    deploy(admin, "slow-load", "fake://m?load_s=60", idle_timeout_s=5)
    created = admin.post("/v1/keys", json={"tenant": "rpm-expire", "requests_per_minute": 1})
    headers = {"Authorization": f"Bearer {created.json()['key']}"}
    job_body = {k: v for k, v in CHAT.items() if k != "model"}
    body = {"model": "slow-load", "endpoint": "chat.completions", "body": job_body, "ttl_s": 1}
    with httpx.Client(base_url=platform.base_url, timeout=60, headers=headers) as client:
        first = client.post("/v1/jobs", json=body)
        assert first.status_code == 202, first.text
        assert client.post("/v1/jobs", json=body).status_code == 429
        wait_until(
            lambda: client.get(f"/v1/jobs/{first.json()['id']}").json()["status"] == "expired",
            30,
            "the job to expire in the queue",
        )
        # Refilling one request takes 60 s; the expired job gave its request back.
        wait_until(lambda: client.post("/v1/jobs", json=body).status_code == 202, 10, "give-back")
    admin.delete("/v1/deployments/slow-load")


def _limited_client(platform: Platform, admin, tenant: str, **limits) -> httpx.Client:
    created = admin.post("/v1/keys", json={"tenant": tenant, **limits})
    assert created.status_code == 201, created.text
    headers = {"Authorization": f"Bearer {created.json()['key']}"}
    return httpx.Client(base_url=platform.base_url, timeout=60, headers=headers)


def test_tokenize_and_detokenize_count_against_requests_per_minute(platform, admin):
    tokenize = {"model": "hostile", "prompt": "Paris is"}
    with _limited_client(platform, admin, "rpm-tokenize", requests_per_minute=2) as client:
        assert client.post("/tokenize", json=tokenize).status_code == 200
        assert (
            client.post("/detokenize", json={"model": "hostile", "tokens": [80]}).status_code == 200
        )
        for path, body in (
            ("/tokenize", tokenize),
            ("/detokenize", {"model": "hostile", "tokens": [80]}),
        ):
            refused = client.post(path, json=body)
            assert _assert_openai_error(refused, 429)["code"] == "rate_limit_exceeded"
            assert int(refused.headers["retry-after"]) >= 1
        # The same bucket as chat's.
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 429


def test_tokenize_counts_the_prompts_tokens_against_tokens_per_minute(platform, admin):
    with _limited_client(platform, admin, "tpm-tokenize", tokens_per_minute=1000) as client:
        # The fake model's tokenizer: one token a byte, so 900 tokens.
        counted = client.post("/tokenize", json={"model": "hostile", "prompt": "p" * 900})
        assert counted.status_code == 200, counted.text
        assert counted.json()["count"] >= 900
        # Chat reserves prompt + 200: more than the ~100 tokens left.
        chat = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 200})
        assert _assert_openai_error(chat, 429)["code"] == "rate_limit_exceeded"


def test_tokenize_refuses_input_longer_than_the_context_can_hold(admin, tenant):
    # "hostile" has the fake model's context, 2048 tokens: 16 characters a token at most.
    long = "p" * (16 * 2048 + 1)
    for body, param in (
        ({"prompt": long}, "prompt"),
        ({"messages": [{"role": "user", "content": long}]}, "messages"),
    ):
        error = _assert_openai_error(
            tenant.post("/tokenize", json={"model": "hostile", **body}), 400
        )
        assert error["param"] == param and "2048 tokens" in error["message"]
    ids = {"model": "hostile", "tokens": [80] * 2049}
    error = _assert_openai_error(tenant.post("/detokenize", json=ids), 400)
    assert error["param"] == "tokens" and "2048" in error["message"]


def test_tenants_see_deployments_without_operator_details(admin, tenant):
    [listed] = [d for d in tenant.get("/v1/deployments").json()["data"] if d["name"] == "hostile"]
    one = tenant.get("/v1/deployments/hostile").json()
    for view in (listed, one):
        assert view["status"] and "replicas" in view and "max_model_len" in view
        for hidden in ("source", "owner", "price_per_gpu_second_micros", "max_concurrency"):
            assert hidden not in view
        assert view["runners"] == [] and view["error_log"] is None
    full = admin.get("/v1/deployments/hostile").json()
    assert full["source"].startswith("fake://") and full["runners"]
    assert all("pid" in r and "log_tail" in r for r in full["runners"])


def test_a_tenant_gets_no_base_cheaper_or_unseen_through_an_adapter(platform, admin, tmp_path):
    lora = {"engine": {"enable_lora": True}, "idle_timeout_s": 120}
    prices = {"price_per_1m_input_tokens_micros": 10**9, "price_per_1m_output_tokens_micros": 1}
    deploy(admin, "hostile-priced", "fake://m?step_ms=1", serving={"batch_discount_pct": 10},
           **prices, **lora)  # fmt: skip
    deploy(admin, "hostile-private", "fake://m?step_ms=1", visibility="private", **lora)
    quota = {"max_deployments": 2, "allowed_sources": [str(tmp_path)]}
    assert admin.put("/v1/tenants/lorat/quota", json=quota).status_code == 200
    key = admin.post("/v1/keys", json={"tenant": "lorat", "name": "k"}).json()["key"]
    source = str(write_adapter(tmp_path / "zero"))
    with httpx.Client(
        base_url=platform.base_url, timeout=60, headers={"Authorization": f"Bearer {key}"}
    ) as client:
        messages = {}
        for fields, status, param in (
            ({"base": "hostile-priced", "price_per_1m_output_tokens_micros": 0}, 403,
             "price_per_1m_output_tokens_micros"),
            ({"base": "hostile-priced", "serving": {"batch_discount_pct": 100}}, 403,
             "serving.batch_discount_pct"),
            ({"base": "hostile-private"}, 400, "base"),  # exists, but not for lorat
            ({"base": "hostile-absent"}, 400, "base"),
            ({"base": "hostile"}, 400, "base"),  # no LoRA
        ):  # fmt: skip
            body = {"name": "lorat-a", "source": source, **fields}
            error = _assert_openai_error(client.post("/v1/deployments", json=body), status)
            assert error["param"] == param, error
            messages[fields["base"]] = error["message"]
        # A base it may not see reads exactly as one that does not exist.
        assert messages["hostile-private"].replace("hostile-private", "X") == messages[
            "hostile-absent"
        ].replace("hostile-absent", "X")
        body = {"name": "lorat-a", "source": source, "base": "hostile-priced"}
        created = client.post("/v1/deployments", json=body)
        assert created.status_code == 201, created.text
        view = created.json()
        assert view["price_per_1m_input_tokens_micros"] == 10**9
        assert view["serving"]["batch_discount_pct"] == 10
        patched = client.patch(
            "/v1/deployments/lorat-a", json={"price_per_1m_input_tokens_micros": 1}
        )
        assert _assert_openai_error(patched, 403)["param"] == "price_per_1m_input_tokens_micros"


def test_metrics_need_the_metrics_token_or_the_admin_key(platform, admin, tenant):
    url = platform.base_url + "/metrics"
    _assert_openai_error(httpx.get(url), 401)
    _assert_openai_error(tenant.get("/metrics"), 403)
    _assert_openai_error(httpx.get(url, headers={"Authorization": "Bearer wrong"}), 401)
    scraped = httpx.get(url, headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert scraped.status_code == 200 and "ebb_http_requests_total" in scraped.text
    assert admin.get("/metrics").status_code == 200


def test_api_schema_is_the_admins_and_describes_every_body(platform, admin, tenant):
    _assert_openai_error(httpx.get(platform.base_url + "/openapi.json"), 401)
    _assert_openai_error(tenant.get("/openapi.json"), 403)
    _assert_openai_error(httpx.get(platform.base_url + "/docs"), 404)
    schema = admin.get("/openapi.json").json()
    for method, path, _ in BODY_ROUTES:
        template = path.replace("/hostile", "/{name}").replace("/fuzz/", "/{tenant}/")
        template = template.replace("key_000000000000", "{key_id}")
        operation = schema["paths"][template][method.lower()]
        body_schema = operation["requestBody"]["content"]["application/json"]["schema"]
        assert "$ref" in body_schema or "anyOf" in body_schema, (path, body_schema)
    chat = schema["components"]["schemas"]["ChatCompletionRequest"]
    assert {"model", "messages"} <= set(chat["required"])
    assert "stop" in chat["properties"]


def test_the_cli_works_with_a_tenant_key_and_shows_no_sources(platform, admin):
    key = admin.post("/v1/keys", json={"tenant": "cli-t"}).json()["key"]
    for args in (("deployments",), ("deployments", "show", "hostile"), ("status",)):
        shown = platform.cli(*args, EBB_API_KEY=key)
        assert shown.returncode == 0, (args, shown.stderr)
        assert "hostile" in shown.stdout and "fake://" not in shown.stdout
    assert "fake://" in platform.cli("deployments", "show", "hostile").stdout


def _batch_line(**fields) -> dict:
    line = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": CHAT}
    return {**line, **fields}


def _jsonl(*lines: dict) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


# Batch API input files no batch can be made of, each a 400 (or a batch failed with the
# reason), never a 5xx.
HOSTILE_BATCH_FILES = {
    "deep": _jsonl(_batch_line())[:-3] + b', "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
    "surrogate-custom-id": b'{"custom_id": "\\ud800", "method": "POST", "url": '
    b'"/v1/chat/completions", "body": {"model": "hostile"}}\n',
    "surrogate-url": b'{"custom_id": "u", "method": "POST", "url": "\\udc00", "body": {}}\n',
    "surrogate-key": b'{"\\ud83d": 1}\n',
    "not-utf8": b'{"custom_id": "\xff\xfe", "method": "POST"}\n',
    "utf16": _jsonl(_batch_line()).decode().encode("utf-16"),
    "nul": b"\x00" * 64 + b"\n",
    "bad-json": b"{not json\n",
    "truncated": _jsonl(_batch_line())[:-5] + b"\n",
    "array": b"[1, 2, 3]\n",
    "string": b'"just text"\n',
    "huge-line": _jsonl(_batch_line(body={**CHAT, "user": "x" * 2_000_000})),
    "huge-number": _jsonl(_batch_line(body={**CHAT, "max_tokens": 2**70})),
    "no-custom-id": _jsonl({k: v for k, v in _batch_line().items() if k != "custom_id"}),
    "null-custom-id": _jsonl(_batch_line(custom_id=None)),
    "long-custom-id": _jsonl(_batch_line(custom_id="x" * 513)),
    "no-body": _jsonl({k: v for k, v in _batch_line().items() if k != "body"}),
    "body-without-model": _jsonl(_batch_line(body={"messages": MESSAGES})),
    "model-not-text": _jsonl(_batch_line(body={**CHAT, "model": {"a": [1]}})),
    "wrong-url": _jsonl(_batch_line(url="/v1/embeddings")),
    "extra-field": _jsonl(_batch_line(extra=1)),
    "twice": _jsonl(_batch_line(), _batch_line()),
    "blank-lines": b"\n \n\r\n",
}


def _upload(client: httpx.Client, content: bytes, **form) -> httpx.Response:
    return client.post(
        "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch", **form}
    )


def _validated(client: httpx.Client, batch_id: str, name: str) -> dict:
    def look() -> dict | None:
        batch = client.get(f"/v1/batches/{batch_id}").json()
        return batch if batch["status"] != "validating" else None

    return wait_until(look, 60, f"the batch of {name} to be validated")


@pytest.mark.parametrize("name", list(HOSTILE_BATCH_FILES))
def test_hostile_batch_files_never_get_a_5xx(admin, tenant, name):
    for client in (admin, tenant):
        uploaded = _upload(client, HOSTILE_BATCH_FILES[name])
        assert uploaded.status_code < 500, uploaded.text
        if uploaded.status_code >= 400:
            _assert_openai_error(uploaded, uploaded.status_code)
            continue
        created = client.post(
            "/v1/batches",
            json={
                "input_file_id": uploaded.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        assert created.status_code < 500, (name, created.text)
        if created.status_code >= 400:
            assert _assert_openai_error(created, created.status_code)["param"] == "input_file_id"
        else:  # read in the background: failed naming the line, or queued (refusals in the
            # error file)
            batch = _validated(client, created.json()["id"], name)
            if batch["status"] == "failed":
                [error] = batch["errors"]["data"]
                assert error["message"] and error["param"] == "input_file_id"
                assert isinstance(error["line"], int)


def test_hostile_expires_after_and_deletes_get_a_4xx(admin, tenant):
    for anchor, seconds in (
        ("created_at", "-1"),
        ("created_at", "3600.5"),
        ("created_at", "\u0663\u0666\u0660\u0660"),  # Arabic-Indic digits
        ("created_at", "9" * 5000),
        ("created_at", ""),
        ("last_active_at", "3600"),
        ("", "3600"),
    ):
        form = {"expires_after[anchor]": anchor, "expires_after[seconds]": seconds}
        refused = _upload(tenant, _jsonl(_batch_line()), **form)
        assert refused.status_code == 400, (anchor, seconds, refused.text)
        assert _assert_openai_error(refused, 400)["param"].startswith("expires_after")
    # Another tenant's file, or a path, is not there to delete; its owner's stays.
    owned = _upload(admin, _jsonl(_batch_line())).json()["id"]
    for file_id in (owned, "..", ".%2e", "file-x%2f..%2f..", "x" * 5000, "\u00b2"):
        gone = tenant.delete(f"/v1/files/{file_id}")
        assert gone.status_code in (404, 405), (file_id, gone.text)
        _assert_openai_error(gone, gone.status_code)
    assert admin.get(f"/v1/files/{owned}").status_code == 200
    assert admin.delete(f"/v1/files/{owned}").json()["deleted"] is True


def test_hostile_uploads_get_a_4xx(admin, tenant):
    for client in (admin, tenant):
        for response in (
            _upload(client, b"{}\n", purpose="fine-tune"),
            client.post("/v1/files", files={"file": ("in.jsonl", b"{}\n")}),
            client.post("/v1/files", data={"purpose": "batch"}),
            client.post("/v1/files", data={"purpose": "batch", "file": "not a file"}),
            client.post(
                "/v1/files",
                content=b'--x\r\nContent-Disposition: form-data; name="file"\r\n\r\n{}',
                headers={"content-type": "multipart/form-data; boundary=x"},
            ),
            _upload(client, b""),
        ):
            assert 400 <= response.status_code < 500, response.text
            _assert_openai_error(response, response.status_code)


def test_stored_responses_keep_nothing_hostile(platform, admin, tenant):
    """What a stored response keeps is what continues it: echoed annotations (never
    tokenised) are dropped, untokenised fields are bounded, and previous_response_id in
    any hostile form is a 4xx naming it."""
    part = {"type": "input_text", "text": "Paris is", "annotations": ["a" * (LIMIT_BYTES // 2)]}
    body = {**RESPONSE, "input": [{"role": "user", "content": [part]}]}
    created = tenant.post("/v1/responses", json=body)
    assert created.status_code == 200, created.text
    client = platform.redis()
    (key,) = client.scan_iter(match=keys.stored_response("acme", created.json()["id"]))
    assert client.strlen(key) < 16 * 1024
    for field, value in (
        ("user", "u" * 1000),
        (
            "text",
            {
                "format": {
                    "type": "json_schema",
                    "name": "n",
                    "schema": {},
                    "description": "d" * 10_000,
                }
            },
        ),
        ("input", [{"role": "user", "content": "hi", "id": "i" * 1000}]),
    ):
        response = tenant.post("/v1/responses", json={**RESPONSE, field: value})
        assert _assert_openai_error(response, 400)["param"].startswith(field)
    mine = created.json()["id"]
    other = admin.post("/v1/responses", json=RESPONSE).json()["id"]  # the admin's tenant
    for previous in (other, "resp_" + "0" * 32, "resp_" + "x" * 5000, "../" + mine, mine + "\n"):
        response = tenant.post("/v1/responses", json={**RESPONSE, "previous_response_id": previous})
        assert 400 <= response.status_code < 500, response.text
        assert _assert_openai_error(response, response.status_code)["param"] == (
            "previous_response_id"
        )


# A deployment's own chat template is a tenant's code: each of these compiles, and each is
# stopped by its render budget (issue 46) with a 400 for the request, on chat and /tokenize.
HOSTILE_TEMPLATES = {
    "nested loops": "{% for i in range(15000) %}{% for j in range(15000) %}{% endfor %}"
    "{% endfor %}",
    "string multiplication": "{{ 'x' * 200000000 }}",
    "doubling in a loop": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    "list growth": "{% set ns = namespace(l=[0]) %}{% for i in range(60) %}"
    "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}",
    "macro recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "format width": "{{ '{:>900000000}'.format('x') }}",
}


@pytest.fixture(scope="module")
def templated(admin):
    deploy(admin, "tpl-hostile", "fake://m?step_ms=1", idle_timeout_s=120)
    yield "tpl-hostile"
    admin.delete("/v1/deployments/tpl-hostile")


@pytest.mark.parametrize("name", list(HOSTILE_TEMPLATES))
def test_hostile_chat_templates_are_a_400_for_their_request(admin, templated, name):
    serving = {"serving": {"chat_template": HOSTILE_TEMPLATES[name]}}
    assert admin.patch(f"/v1/deployments/{templated}", json=serving).status_code == 200
    chat = admin.post("/v1/chat/completions", json={**CHAT, "model": templated})
    tokenized = admin.post("/tokenize", json={"model": templated, "messages": MESSAGES})
    for response in (chat, tokenized):
        error = _assert_openai_error(response, 400)
        assert error["code"] == "chat_template_budget" and error["param"] == "messages", error
    # The platform answers on: the next request with a plain template renders it.
    plain = {"serving": {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}}
    assert admin.patch(f"/v1/deployments/{templated}", json=plain).status_code == 200
    tokens = admin.post("/tokenize", json={"model": templated, "messages": MESSAGES}).json()
    assert tokens["count"] == len(MESSAGES[0]["content"])


def test_a_chat_template_is_compiled_and_bounded_when_deployed(admin, templated):
    for template, says in (("{% if %}", "line 1"), ("x" * 65537, "65536")):
        response = admin.patch(
            f"/v1/deployments/{templated}", json={"serving": {"chat_template": template}}
        )
        error = _assert_openai_error(response, 400)
        assert error["param"] == "serving.chat_template" and says in error["message"], error
