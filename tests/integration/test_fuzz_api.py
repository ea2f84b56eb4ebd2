"""Schema-driven fuzzing of the frontdoor: schemathesis generates requests from the API's
own OpenAPI schema (every route, every body; valid and schema-violating ones) and sends
them, with real keys, to a live platform on the fake engine; and it makes Batch API input
files of random lines and batches of them. Whatever it sends, the answer is never a 5xx,
and every refusal is in the OpenAI error shape."""

from __future__ import annotations

import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from support import Platform, deploy, temp_home, wait_until

from ebb.config import Settings
from ebb.frontdoor.app import create_app

pytestmark = pytest.mark.integration

# Bounded so the whole module runs in well under a minute or two on two cores.
EXAMPLES_PER_OPERATION = 10

# The schema the frontdoor publishes (the test below checks the live one is the same),
# read at collection time so that each operation is a test of its own.
APP_SCHEMA = create_app(Settings()).openapi()
OPERATIONS = [
    result.ok() for result in schemathesis.openapi.from_dict(APP_SCHEMA).get_all_operations()
]

_SETTINGS = settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    database=None,
    derandomize=True,  # the same cases every run: a failure here is reproducible
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def platform():
    # Public docs here (the hostile-input module checks the default, admin-only schema).
    p = Platform(
        home=temp_home("ebb-fuzz-"), redis_url=None, env_extra={"EBB_API_DOCS": "1"}
    ).start()
    with p.admin() as admin:
        # A real model the fuzzer may name, so some requests run all the way through.
        deploy(admin, "fuzz", "fake://m?step_ms=1", idle_timeout_s=120)
    yield p
    assert p.stop() == 0


@pytest.fixture(scope="module")
def keys(platform, admin) -> dict[str, str]:
    tenant = admin.post("/v1/keys", json={"tenant": "fuzzer", "name": "fuzz"}).json()["key"]
    return {"admin": platform.admin_key, "tenant": tenant}


def test_the_live_schema_is_the_one_fuzzed(platform):
    assert httpx.get(platform.base_url + "/openapi.json").json() == APP_SCHEMA
    assert len(OPERATIONS) >= 20
    docs = httpx.get(platform.base_url + "/docs")
    assert docs.status_code == 200 and "/openapi.json" in docs.text


def _call(platform: Platform, key: str, case) -> None:
    response = case.call(
        base_url=platform.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )
    assert response.status_code < 500, (case.method, case.path, case.body, response.text)
    if response.status_code >= 400 and "json" in response.headers.get("content-type", ""):
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] != "internal_error"


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: f"{op.method.upper()} {op.path}")
@pytest.mark.parametrize("who", ["admin", "tenant"])
def test_no_5xx(platform, keys, operation, who):
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

        @_SETTINGS
        @given(case=operation.as_strategy(generation_mode=mode))
        def fuzz(case) -> None:
            _call(platform, keys[who], case)

        try:
            fuzz()
        except Unsatisfiable:
            # Nothing in the operation's schema can be violated (no body, free strings).
            assert mode is GenerationMode.NEGATIVE


def test_the_platform_still_serves_after_fuzzing(admin):
    reply = admin.post(
        "/v1/chat/completions",
        json={"model": "fuzz", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    assert reply.status_code == 200, reply.text


# Batch API input files: lines of random JSON (objects shaped like requests, and anything
# else), random bytes and text with lone surrogates, uploaded and made a batch of.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_REQUEST_LINE = st.fixed_dictionaries(
    {
        "custom_id": st.text(max_size=12) | _JSON,
        "method": st.just("POST") | _JSON,
        "url": st.just("/v1/chat/completions") | st.text(max_size=12),
        "body": st.fixed_dictionaries(
            {"model": st.just("fuzz") | _JSON, "messages": _JSON, "max_tokens": _JSON}
        )
        | _JSON,
    }
)
# Lines that once got a 5xx: always among those tried.
_KNOWN_HOSTILE = [
    b'{"custom_id": "\\ud800", "method": "POST", "url": "/v1/chat/completions", '
    b'"body": {"model": "fuzz"}}',
    b'{"custom_id": "d", "method": "POST", "url": "/v1/chat/completions", "body": '
    b'{"model": "fuzz", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
]
_RAW_LINE = st.one_of(
    st.sampled_from(_KNOWN_HOSTILE),
    _REQUEST_LINE.map(lambda line: json.dumps(line).encode()),
    _JSON.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=40).map(lambda raw: raw.replace(b"\n", b" ")),
    st.text(max_size=20).map(lambda text: text.encode("utf-8", "surrogatepass")),
)


@pytest.mark.parametrize("who", ["admin", "tenant"])
def test_batch_input_files_never_get_a_5xx(platform, keys, who):
    headers = {"Authorization": f"Bearer {keys[who]}"}

    @_SETTINGS
    @given(lines=st.lists(_RAW_LINE, min_size=1, max_size=4))
    @example(lines=_KNOWN_HOSTILE[:1])
    @example(lines=[json.dumps({"custom_id": "ok"}).encode(), _KNOWN_HOSTILE[1]])
    def fuzz(lines: list[bytes]) -> None:
        with httpx.Client(base_url=platform.base_url, headers=headers, timeout=60) as client:
            content = b"\n".join(lines) + b"\n"
            uploaded = client.post(
                "/v1/files", files={"file": ("f.jsonl", content)}, data={"purpose": "batch"}
            )
            _assert_no_5xx(uploaded)
            if uploaded.status_code >= 400:
                return
            body = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions",
                    "completion_window": "24h"}  # fmt: skip
            created = client.post("/v1/batches", json=body)
            _assert_no_5xx(created)
            if created.status_code != 200:
                return
            # Validated in the background: it leaves `validating`, failed with the reason
            # or queued, never stuck.
            assert created.json()["status"] == "validating"
            batch = wait_until(
                lambda: (
                    (b := client.get(f"/v1/batches/{created.json()['id']}").json())["status"]
                    != "validating"
                    and b
                ),
                60,
                "the fuzzed batch to be validated",
            )
            if batch["status"] == "failed":
                assert batch["errors"]["data"][0]["message"]

    fuzz()


def _assert_no_5xx(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] != "internal_error"
