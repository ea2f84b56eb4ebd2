"""Spend caps through the whole platform (`ebb up`, fake engine): a request reserves its
maximum cost and settles its real one; past the cap the official `openai` client gets
`insufficient_quota` (and does not retry); a budget resets with its period; the soft
limit's signed webhook goes out once per period; two frontdoors never overshoot; a job
holds its reservation until it settles."""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import redis
from standardwebhooks import Webhook
from support import Platform, deploy, temp_home, wait_until
from support.billing import new_key, tenant_client
from support.frontdoors import start_frontdoor
from support.webhook_receiver import Receiver

from ebb.queue import keys
from ebb.queue.budget_periods import Period, period_label

pytestmark = pytest.mark.integration

MODEL = "budget-m"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
# One micro per prompt token, two per completion token: costs are easy to check.
PRICES = {
    "price_per_1m_input_tokens_micros": 1_000_000,
    "price_per_1m_output_tokens_micros": 2_000_000,
}
ENV = {
    "EBB_WEBHOOK_ALLOWED_CIDRS": "127.0.0.0/8",
    "EBB_WEBHOOK_RETRY_BASE_S": "0.2",
    "EBB_WEBHOOK_RETRY_MAX_DELAY_S": "1",
}


@pytest.fixture(scope="module")
def platform():
    p = Platform(home=temp_home("ebb-budget-"), redis_url=None, env_extra=ENV).start()
    with p.admin() as admin:
        deploy(admin, MODEL, "fake://m?step_ms=1", idle_timeout_s=300, **PRICES)
        deploy(admin, "budget-slow", "fake://m?step_ms=40", idle_timeout_s=300, **PRICES)
    yield p
    assert p.stop() == 0


@pytest.fixture(scope="module")
def admin(platform):
    with platform.admin() as client:
        yield client


@pytest.fixture(scope="module")
def platform_redis(platform):
    info = json.loads((platform.home / "run.json").read_text())
    return redis.Redis.from_url(info["redis_url"])


@pytest.fixture(scope="module")
def prompt_tokens(admin) -> int:
    """The prompt's tokens as the fake model counts them (the admin has no budget)."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1}
    return admin.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]


def _tenant(platform, admin, tenant: str, amount: int, **budget) -> httpx.Client:
    key = new_key(admin, tenant)
    _set_budget(admin, tenant, {"amount_micros": amount, "period": "day", **budget})
    return tenant_client(platform, key)


def _set_budget(admin, tenant: str, budget: dict | None, **fields) -> dict:
    response = admin.put(f"/v1/tenants/{tenant}/limits", json={"budget": budget, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def _budget(client: httpx.Client) -> dict:
    response = client.get("/v1/budgets")
    assert response.status_code == 200, response.text
    return response.json()["data"][0]["budget"]


def _chat(client: httpx.Client, max_tokens: int, **extra) -> httpx.Response:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens, **extra}
    return client.post("/v1/chat/completions", json=body)


def _cost(usage: dict) -> int:
    return usage["prompt_tokens"] + 2 * usage["completion_tokens"]


def test_a_request_reserves_its_maximum_and_settles_to_its_real_cost(platform, admin):
    client = _tenant(platform, admin, "bud-settle", 10**9)
    body = {
        "model": "budget-slow",
        "messages": MESSAGES,
        "max_tokens": 100,
        "stop": ["Paris"],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: {"))
        held = _budget(client)  # mid-stream: the worst case is held, nothing spent yet
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] < 100  # it stopped early: the real cost is lower
    assert held["spent_micros"] == 0
    assert held["reserved_micros"] == usage["prompt_tokens"] + 2 * 100
    settled = _budget(client)
    assert settled["spent_micros"] == _cost(usage)
    assert settled["reserved_micros"] == 0


def test_past_the_cap_the_openai_client_gets_insufficient_quota_once(
    platform, admin, prompt_tokens
):
    key = new_key(admin, "bud-cap")
    # Room for one request of max_tokens 10, not for a second.
    one = prompt_tokens + 2 * 10
    _set_budget(admin, "bud-cap", {"amount_micros": one + one // 2, "period": "day"})
    sent: list[httpx.Request] = []
    http = httpx.Client(event_hooks={"request": [sent.append]})
    client = openai.OpenAI(
        base_url=platform.base_url + "/v1", api_key=key, max_retries=2, http_client=http
    )
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10)
    sent.clear()
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10)
    error = caught.value
    assert error.status_code == 429
    assert error.code == "insufficient_quota" and error.type == "insufficient_quota"
    assert "tenant 'bud-cap'" in error.message
    tomorrow = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 86400))
    assert f"resets at {tomorrow}T00:00:00Z" in error.message
    assert error.response.headers["x-should-retry"] == "false"
    assert len(sent) == 1  # the client did not retry it
    # A job past the cap is refused alike, and nothing refused holds any budget.
    job = {"model": MODEL, "endpoint": "chat.completions",
           "body": {"messages": MESSAGES, "max_tokens": 10}}  # fmt: skip
    refused = tenant_client(platform, key).post("/v1/jobs", json=job)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "insufficient_quota"
    assert _budget(tenant_client(platform, key))["reserved_micros"] == 0


def test_a_keys_own_budget_refuses_naming_the_key(platform, admin):
    key = new_key(admin, "bud-key")
    key_id = next(k["id"] for k in admin.get("/v1/keys").json()["data"] if k["tenant"] == "bud-key")
    response = admin.put(f"/v1/keys/{key_id}/limits", json={"budget": {"amount_micros": 0}})
    assert response.status_code == 200, response.text
    assert response.json()["budget"]["period"] is None  # a lifetime budget
    refused = _chat(tenant_client(platform, key), 5)
    assert refused.status_code == 429
    assert f"API key {key_id}" in refused.json()["error"]["message"]
    assert "does not reset" in refused.json()["error"]["message"]


def test_the_budget_resets_with_its_period(platform, admin, platform_redis, prompt_tokens):
    one = prompt_tokens + 2 * 10
    client = _tenant(platform, admin, "bud-reset", one)
    assert _chat(client, 10).status_code == 200
    assert _chat(client, 10).status_code == 429
    # Today's spend becomes yesterday's, as it will be at midnight UTC: a new day's key.
    now_s = time.time()
    today = keys.budget_spend("tenant:bud-reset", period_label(Period.DAY, now_s))
    yesterday = keys.budget_spend("tenant:bud-reset", period_label(Period.DAY, now_s - 86400))
    platform_redis.rename(today, yesterday)
    assert _chat(client, 10).status_code == 200
    assert _budget(client)["spent_micros"] <= one


def test_the_soft_limit_webhook_goes_out_once_per_period(platform, admin, prompt_tokens):
    receiver = Receiver().start()
    try:
        one = prompt_tokens + 2 * 10
        client = _tenant(platform, admin, "bud-soft", 10 * one, soft_limit=0.3)
        _set_budget(
            admin,
            "bud-soft",
            {"amount_micros": 10 * one, "period": "day", "soft_limit": 0.3},
            webhook_url=receiver.url,
        )
        for _ in range(8):  # 3 cross 30 %, the 5 after them must not send it again
            assert _chat(client, 10).status_code == 200
        event = "budget.soft_limit_reached"
        wait_until(lambda: receiver.accepted(event=event), 30, "the soft-limit webhook")
        assert _chat(client, 10).status_code == 200
        secret = admin.get("/v1/webhooks/secret", params={"tenant": "bud-soft"}).json()
        delivered = receiver.accepted(event=event)
        assert len(delivered) == 1
        payload = Webhook(secret["secret"]).verify(delivered[0].body, delivered[0].headers)
        data = payload["data"]
        assert data["tenant"] == "bud-soft" and data["key_id"] is None
        assert data["amount_micros"] == 10 * one and data["period"] == "day"
        assert 3 * one <= data["spent_micros"] < 4 * one
    finally:
        receiver.stop()


def test_two_frontdoors_together_never_pass_the_cap(platform, admin, prompt_tokens):
    other = start_frontdoor(platform, "budget-2")
    try:
        one = prompt_tokens + 2 * 10  # "The capital ..." is longer: each uses max_tokens
        key = new_key(admin, "bud-two")
        _set_budget(admin, "bud-two", {"amount_micros": 5 * one + one // 2, "period": "month"})
        auth = {"Authorization": f"Bearer {key}"}
        clients = [
            tenant_client(platform, key),
            httpx.Client(base_url=other.url, timeout=60, headers=auth),
        ]
        with ThreadPoolExecutor(24) as pool:
            statuses = list(pool.map(lambda i: _chat(clients[i % 2], 10).status_code, range(24)))
        assert statuses.count(200) == 5
        assert statuses.count(429) == 19
        spend = _budget(clients[0])
        assert spend["spent_micros"] == 5 * one and spend["reserved_micros"] == 0
    finally:
        assert other.stop() in (0, -signal.SIGTERM)


def test_a_job_holds_its_reservation_until_it_settles(platform, admin):
    client = _tenant(platform, admin, "bud-job", 10**9)
    job = {"model": "budget-slow", "endpoint": "chat.completions",
           "body": {"messages": MESSAGES, "max_tokens": 100, "stop": ["Paris"]}}  # fmt: skip
    created = client.post("/v1/jobs", json=job)
    assert created.status_code == 202, created.text
    job_id = created.json()["id"]
    assert _budget(client)["reserved_micros"] > 0

    def done() -> dict | None:
        view = client.get(f"/v1/jobs/{job_id}").json()
        return view if view["status"] == "succeeded" else None

    view = wait_until(done, 60, "the job to succeed")
    wait_until(lambda: _budget(client)["reserved_micros"] == 0, 30, "the job's budget settled")
    assert _budget(client)["spent_micros"] == _cost(view["usage"])


def test_budgets_in_the_limits_routes(admin):
    bad = admin.put("/v1/tenants/bud-bad/limits", json={"budget": {"amount_micros": -5}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "budget.amount_micros"
    url = admin.put("/v1/tenants/bud-bad/limits", json={"webhook_url": "http://169.254.169.254/"})
    assert url.status_code == 400 and url.json()["error"]["param"] == "webhook_url"
    _set_budget(admin, "bud-bad", {"amount_micros": 7, "period": "month"})
    # Setting a rate limit leaves the budget as it was; null removes it.
    kept = admin.put("/v1/tenants/bud-bad/limits", json={"requests_per_minute": 5}).json()
    assert kept["budget"]["amount_micros"] == 7 and kept["requests_per_minute"] == 5
    assert admin.get("/v1/tenants/bud-bad/limits").json()["budget"]["period"] == "month"
    listed = {t["tenant"]: t for t in admin.get("/v1/tenants").json()["data"]}
    assert listed["bud-bad"]["budget"]["amount_micros"] == 7  # the console's tenants table
    assert _set_budget(admin, "bud-bad", None)["budget"] is None


def test_the_cli_sets_a_budget_and_shows_its_spend(platform, admin):
    new_key(admin, "bud-cli")
    set_ = platform.cli(
        "tenants", "limits", "bud-cli", "--budget", "2.50", "--budget-period", "day"
    )
    assert set_.returncode == 0, set_.stderr
    assert "0.000000 of 2.500000 spent per day" in set_.stdout
    bad = platform.cli("tenants", "limits", "bud-cli", "--budget", "-1")
    assert bad.returncode != 0 and "--budget" in bad.stderr
    shown = platform.cli("usage", "budget", "--tenant", "bud-cli", "--json")
    assert shown.returncode == 0, shown.stderr
    budget = json.loads(shown.stdout)["data"][0]["budget"]
    assert budget["amount_micros"] == 2_500_000 and budget["period"] == "day"
    usage = platform.cli("usage", "--tenant", "bud-cli")  # `ebb usage` shows budgets too
    assert usage.returncode == 0, usage.stderr
    assert "2.500000 / day" in usage.stdout
    every = admin.get("/v1/budgets").json()["data"]  # the admin, naming no tenant: all
    assert any(r["tenant"] == "bud-cli" and r["key_id"] is None for r in every)
    # Setting a rate limit from the CLI keeps the budget.
    rpm = platform.cli("keys", "limits", "--tenant", "bud-cli", "--rpm", "50", "--json")
    assert rpm.returncode == 0, rpm.stderr
    assert json.loads(rpm.stdout)["budget"]["amount_micros"] == 2_500_000


def test_a_sigkilled_frontdoors_reservation_is_settled_to_what_was_billed(platform, admin):
    """The frontdoor holding a streamed request's reservation dies mid-stream: the request
    runs to its end without it and is billed, and the controller's budget reaper settles
    the reservation to that cost once the frontdoor's heartbeat has expired."""
    other = start_frontdoor(platform, "budget-killed")
    key = new_key(admin, "bud-killed")
    _set_budget(admin, "bud-killed", {"amount_micros": 10**9, "period": None})  # lifetime
    body = {"model": "budget-slow", "messages": MESSAGES, "max_tokens": 30, "stream": True}
    auth = {"Authorization": f"Bearer {key}"}
    try:
        with (
            httpx.Client(base_url=other.url, timeout=60, headers=auth) as c,
            c.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            assert response.status_code == 200
            # Held until the kill: a line iterator dropped here would close the connection,
            # and a client that leaves has its request aborted and settled at once.
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: {"))
            client = tenant_client(platform, key)
            held = _budget(client)
            assert held["reserved_micros"] > 0 and held["spent_micros"] == 0
            other.stop(signal.SIGKILL)
    finally:
        if other.proc.poll() is None:
            other.stop(signal.SIGKILL)

    def settled() -> dict | None:
        spend = _budget(client)
        return spend if spend["reserved_micros"] == 0 else None

    spend = wait_until(settled, 60, "the dead frontdoor's reservation to be settled")
    # It ran to its end and was billed: settled to that (the prompt and at least the
    # token streamed before the kill, two micros each), never simply released.
    prompt = held["reserved_micros"] - 2 * 30
    assert prompt + 2 <= spend["spent_micros"] <= held["reserved_micros"]
    assert (spend["spent_micros"] - prompt) % 2 == 0


def test_a_sigkilled_frontdoors_reservation_is_released_when_nothing_ran(platform, admin):
    """The frontdoor dies while its request waits for a cold start; the request expires
    in the queue (its admission window passes before the runner is ready) and was never
    billed, so the reaper gives the whole reservation back."""
    deploy(admin, "budget-late", "fake://m?load_s=8", admission_timeout_s=4, **PRICES)
    other = start_frontdoor(platform, "budget-killed-2")
    key = new_key(admin, "bud-released")
    _set_budget(admin, "bud-released", {"amount_micros": 10**9, "period": None})
    client = tenant_client(platform, key)
    auth = {"Authorization": f"Bearer {key}"}
    body = {"model": "budget-late", "messages": MESSAGES, "max_tokens": 30}

    def send() -> int | None:
        """The status it was answered with (None: its frontdoor died first)."""
        with httpx.Client(base_url=other.url, timeout=60, headers=auth) as c:
            try:
                return c.post("/v1/chat/completions", json=body).status_code
            except httpx.TransportError:
                return None

    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(send)
        held = wait_until(
            lambda: (b := _budget(client))["reserved_micros"] > 0 and b,
            30,
            "the queued request's reservation",
        )
        other.stop(signal.SIGKILL)
        assert sent.result() is None, "its frontdoor died before it could settle"

    def released() -> dict | None:
        spend = _budget(client)
        return spend if spend["reserved_micros"] == 0 else None

    spend = wait_until(released, 90, "the dead frontdoor's reservation to be released")
    assert held["spent_micros"] == 0 and spend["spent_micros"] == 0
