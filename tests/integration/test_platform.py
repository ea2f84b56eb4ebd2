"""The whole platform (`ebb up`: redis, frontdoor, controller, runners) on the fake engine,
driven through HTTP and the official `openai` client."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from support import Platform, deploy, deployment, temp_home, wait_until

from ebb.queue import keys
from ebb.testing.fake_model import FAKE_REPLY

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform():
    # A 30 s controller poll: every scale-from-zero below must come from the enqueue's
    # wake-up signal, not from the periodic reconcile.
    p = Platform(
        home=temp_home("ebb-it-"), redis_url=None, env_extra={"EBB_CONTROLLER_POLL_S": "30"}
    ).start()
    yield p
    assert p.stop() == 0
    assert not _live_children(p), "ebb up left processes behind"


def test_chat_through_openai_client(platform, admin):
    deploy(admin, "chat", idle_timeout_s=60)
    client = platform.openai()
    assert "chat" in [m.id for m in client.models.list().data]
    reply = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=12)
    assert reply.choices[0].message.content == FAKE_REPLY[:12]
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 12
    assert reply.usage.prompt_tokens > 0

    stream = client.chat.completions.create(
        model="chat",
        messages=MESSAGES,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == FAKE_REPLY[:8]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8

    completion = client.completions.create(model="chat", prompt="Paris is", max_tokens=5, n=2)
    assert sorted(c.index for c in completion.choices) == [0, 1]
    assert completion.usage.completion_tokens == 10


def test_scale_from_zero_and_back_to_zero(platform, admin, platform_redis):
    deploy(admin, "idle", idle_timeout_s=1, max_replicas=3)
    assert deployment(admin, "idle")["status"] == "scaled_to_zero"
    reply = platform.openai().chat.completions.create(model="idle", messages=MESSAGES, max_tokens=4)
    assert reply.choices[0].message.content == FAKE_REPLY[:4]
    view = wait_until(
        lambda: (
            (d := deployment(admin, "idle"))["status"] == "scaled_to_zero"
            and all(r["state"] == "exited" for r in d["runners"])
            and d
        ),
        30,
        "the runner to drain and exit after its idle timeout",
    )
    assert [r["state"] for r in view["runners"]] == ["exited"], (
        "one request must launch exactly one runner, which exits when idle"
    )


def test_not_admitted_in_time_is_503_and_never_runs(platform, admin, platform_redis):
    # The runner needs 4 s to load; the deployment admits for 1 s.
    deploy(admin, "slow", source="fake://m?load_s=4", admission_timeout_s=1)
    client = platform.openai()
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="slow", messages=MESSAGES, max_tokens=4)
    response = refused.value.response
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1
    assert refused.value.body["code"] == "admission_timeout"
    request_id = response.headers["x-request-id"]
    wait_until(
        lambda: deployment(admin, "slow")["status"] == "ready",
        30,
        "the slow runner to become ready",
    )
    # The runner is up and claiming; the withdrawn request is not in its queue any more.
    assert platform_redis.hget(keys.request(request_id), "state") == b"withdrawn"
    assert platform_redis.zcard(keys.queue("slow")) == 0
    reply = client.chat.completions.create(model="slow", messages=MESSAGES, max_tokens=3)
    assert reply.usage.completion_tokens == 3
    billed = [e[1][b"r"] for e in platform_redis.xrange(keys.USAGE)]
    assert not any(request_id.encode() in record for record in billed)


def test_full_queue_refuses_at_once(platform, admin):
    deploy(admin, "tiny", source="fake://m?load_s=3", queue_depth_limit=1)
    first: dict = {}

    def call():
        first["reply"] = platform.openai().chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=2
        )

    thread = threading.Thread(target=call)
    thread.start()
    wait_until(lambda: deployment(admin, "tiny")["queue_depth"] == 1, 10, "the first to queue")
    with pytest.raises(openai.APIStatusError) as refused:
        platform.openai().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    assert refused.value.status_code == 503
    assert refused.value.body["code"] == "queue_full"
    assert "retry-after" in refused.value.response.headers
    thread.join(timeout=60)
    assert first["reply"].usage.completion_tokens == 2


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "nope", "messages": MESSAGES}, 404, "model"),
        ({"model": "ctx", "messages": MESSAGES, "max_tokens": 0}, 400, "max_tokens"),
        ({"model": "ctx", "messages": MESSAGES, "n": 99}, 400, "n"),
        ({"model": "ctx", "messages": MESSAGES, "max_tokens": 5000}, 400, "max_tokens"),
        ({"model": "ctx", "messages": [{"role": "user", "content": "x" * 600}]}, 400, "messages"),
        (
            {"model": "ctx", "messages": MESSAGES, "response_format": {"type": "xml"}},
            400,
            "response_format.type",
        ),
        ({"model": "ctx", "messages": MESSAGES, "temperature": "hot"}, 400, "temperature"),
        ({"model": "ctx", "messages": MESSAGES, "bogus": 1}, 400, "bogus"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_queued(admin, platform_redis, body, status, param):
    if admin.get("/v1/deployments/ctx").status_code == 404:
        deploy(admin, "ctx", source="fake://m?ctx=512")
    response = admin.post("/v1/chat/completions", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]
    assert platform_redis.zcard(keys.queue(body["model"])) == 0
    assert deployment(admin, "ctx")["runners"] == [], "a refused request launched a runner"


def test_invalid_json_and_keys(platform, admin):
    response = admin.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]

    anonymous = httpx.post(platform.base_url + "/v1/chat/completions", json={})
    assert anonymous.status_code == 401
    assert "Authorization: Bearer" in anonymous.json()["error"]["message"]
    with pytest.raises(openai.AuthenticationError):
        platform.openai(api_key="ebb-sk-wrong").models.list()

    created = admin.post("/v1/keys", json={"tenant": "acme", "name": "ci"}).json()
    tenant = platform.openai(api_key=created["key"])
    assert tenant.models.list().data is not None
    forbidden = httpx.get(
        platform.base_url + "/v1/keys", headers={"Authorization": f"Bearer {created['key']}"}
    )
    assert forbidden.status_code == 403
    assert admin.delete(f"/v1/keys/{created['id']}").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        tenant.models.list()


def test_metrics_describe_runners_and_queues(platform, admin):
    assert httpx.get(platform.base_url + "/metrics").status_code == 401
    text = admin.get("/metrics").text  # /metrics needs the admin key or EBB_METRICS_TOKEN
    assert 'ebb_runners{deployment="chat",state="ready"}' in text
    assert "ebb_queue_wait_seconds_bucket" in text


def _live_children(p: Platform) -> list[str]:
    import psutil

    return [
        " ".join(proc.info["cmdline"] or [])
        for proc in psutil.process_iter(["environ", "cmdline", "status"])
        if (proc.info.get("environ") or {}).get("EBB_HOME") == str(p.home)
        and proc.info["status"] != psutil.STATUS_ZOMBIE
    ]


def test_client_leaving_while_queued_withdraws_the_request(platform, admin, platform_redis):
    deploy(admin, "queued", source="fake://m?load_s=3")
    body = {"model": "queued", "messages": MESSAGES, "max_tokens": 3}
    with pytest.raises(httpx.ReadTimeout):
        admin.post("/v1/chat/completions", json=body, timeout=1.0)
    # The request is gone from the queue, and the runner, once up, never runs it.
    wait_until(lambda: platform_redis.zcard(keys.queue("queued")) == 0, 10, "the withdrawal")
    wait_until(lambda: deployment(admin, "queued")["status"] == "ready", 30, "the runner")
    states = {
        platform_redis.hget(k, "state")
        for k in platform_redis.scan_iter(keys.request("*"))
        if platform_redis.hget(k, "deployment") == b"queued"
    }
    assert states == {b"cancelled"}
