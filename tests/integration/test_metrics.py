"""Serving metrics on /metrics move when they should: the whole platform (`ebb up`, fake
engine), scraped before and after each kind of request."""

from __future__ import annotations

import httpx
import pytest
from support import Platform, deploy, sigkill_runner_mid_stream, temp_home, wait_until
from support.billing import new_key, tenant_client
from support.metrics import scrape

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def platform():
    env = {
        "EBB_GPU_METER_INTERVAL_S": "1",
        "EBB_WEBHOOK_ALLOWED_CIDRS": "127.0.0.0/8",
        "EBB_METRICS_MAX_TENANTS": "3",
    }
    p = Platform(home=temp_home("ebb-metrics-"), redis_url=None, env_extra=env).start()
    yield p
    assert p.stop() == 0


@pytest.fixture(scope="module")
def served(admin):
    """A deployment with a ready runner."""
    deploy(admin, "m", "fake://m?step_ms=5", idle_timeout_s=600)
    chat(admin, "m", 2)
    return "m"


def chat(client: httpx.Client, model: str, max_tokens: int, **extra) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, **extra}
    return client.post("/v1/chat/completions", json=body)


def test_a_request_counts_its_outcome_latency_queue_wait_and_tokens(admin, served):
    before = scrape(admin)
    response = chat(admin, served, 6)
    assert response.status_code == 200
    usage = response.json()["usage"]
    after = scrape(admin)
    ok = {"deployment": served, "outcome": "ok"}
    assert after.value("ebb_requests_total", **ok) == before.value("ebb_requests_total", **ok) + 1
    for histogram in ("ebb_request_duration_seconds", "ebb_queue_wait_seconds"):
        name = histogram + "_count"
        assert after.value(name, deployment=served) == before.value(name, deployment=served) + 1
    for kind in ("prompt", "completion"):
        name, want = f"ebb_{kind}_tokens_total", usage[f"{kind}_tokens"]
        labels = {"deployment": served, "tenant": "admin"}
        assert after.value(name, **labels) - before.value(name, **labels) == want


def test_a_streamed_request_records_ttft_and_time_per_output_token(admin, served):
    before = scrape(admin)
    body = {"model": served, "messages": MESSAGES, "max_tokens": 8, "stream": True}
    with admin.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    after = scrape(admin)
    for name in ("ebb_time_to_first_token_seconds", "ebb_time_per_output_token_seconds"):
        count = name + "_count"
        assert after.value(count, deployment=served) == before.value(count, deployment=served) + 1
        # A positive duration: the sum moved by more than nothing.
        assert after.value(name + "_sum", deployment=served) > before.value(
            name + "_sum", deployment=served
        )


def test_a_429_counts_as_rate_limited(platform, admin, served):
    client = tenant_client(platform, new_key(admin, "rpm-metrics", requests_per_minute=1))
    assert chat(client, served, 1).status_code == 200
    before = scrape(admin)
    assert chat(client, served, 1).status_code == 429
    after = scrape(admin)
    labels = {"deployment": served, "outcome": "rate_limited", "code": "429"}
    assert after.value("ebb_requests_total", **labels) == (
        before.value("ebb_requests_total", **labels) + 1
    )


def test_503s_count_by_reason_and_4xx_by_code(admin):
    deploy(admin, "never", "fake://n?load_s=30", admission_timeout_s=0.5)
    before = scrape(admin)
    assert chat(admin, "never", 1).status_code == 503
    assert chat(admin, "no-such-model", 1).status_code == 404
    after = scrape(admin)
    refused = {"deployment": "never", "outcome": "unavailable", "code": "admission_timeout"}
    unknown = {"deployment": "", "outcome": "client_error", "code": "404"}
    for labels in (refused, unknown):
        assert after.value("ebb_requests_total", **labels) == (
            before.value("ebb_requests_total", **labels) + 1
        ), labels


def test_a_lost_runner_counts_as_runner_lost(admin):
    deploy(admin, "lost", "fake://l?step_ms=20", idle_timeout_s=600)
    assert chat(admin, "lost", 1).status_code == 200
    before = scrape(admin)
    # Two choices: no continuation can replay them (one would go on, see
    # test_continuation.py); the loss is the answer.
    _, events = sigkill_runner_mid_stream(admin, "lost", n=2)
    assert events[-1] == "data: [DONE]"
    after = scrape(admin)
    labels = {"deployment": "lost", "outcome": "runner_lost"}
    assert after.value("ebb_requests_total", **labels) == (
        before.value("ebb_requests_total", **labels) + 1
    )


def test_runner_figures_reach_metrics_kv_prefix_cache_and_batch(admin, served):
    # The same prompt twice: the second finds all but its last token in the prefix cache.
    for _ in range(2):
        assert chat(admin, served, 2).status_code == 200

    def figures():
        s = scrape(admin)
        hits = s.value("ebb_prefix_cache_hit_tokens_total", deployment=served)
        labels = s.labels_of("ebb_batch_size")
        return hits > 0 and labels and s

    s = wait_until(figures, 10, "the runner's prefix-cache figures on /metrics")
    ratio = s.value("ebb_prefix_cache_hit_ratio", deployment=served)
    assert 0 < ratio <= 1
    assert [lab["deployment"] for lab in s.labels_of("ebb_kv_cache_usage_ratio")] == [served]
    assert s.labels_of("ebb_batch_size")[0]["runner"].startswith("r")


def test_gpu_seconds_and_cold_starts_reach_metrics(admin, served):
    def gpu_seconds():
        return scrape(admin).value("ebb_gpu_seconds_total", deployment=served) > 0

    wait_until(gpu_seconds, 15, "metered GPU time of the deployment's runner on /metrics")
    s = scrape(admin)
    assert s.value("ebb_cold_start_seconds_count", deployment=served, phase="total") >= 1
    assert s.value("ebb_redis_up") == 1
    assert s.value("ebb_redis_used_memory_bytes") > 0
    assert s.value("ebb_redis_maxmemory_bytes") >= 0


def test_tenants_beyond_the_cap_are_counted_as_other(platform, admin, served):
    for i in range(4):
        assert (
            chat(tenant_client(platform, new_key(admin, f"cap-{i}")), served, 1).status_code == 200
        )

    def tenants():
        return {lab["tenant"] for lab in scrape(admin).labels_of("ebb_completion_tokens_total")}

    found = wait_until(lambda: "other" in (t := tenants()) and t, 10, "tenant 'other'")
    assert len(found) <= 4  # three named tenants at most, plus "other"


def test_jobs_and_webhook_deliveries_count_by_outcome(admin, served, receiver):
    before = scrape(admin)
    body = {
        "model": served,
        "endpoint": "chat.completions",
        "body": {"messages": MESSAGES, "max_tokens": 2},
        "webhook": {"url": receiver.url, "events": ["job.succeeded"]},
    }
    job = admin.post("/v1/jobs", json=body)
    assert job.status_code == 202, job.text

    def counted():
        s = scrape(admin)
        delivered = "ebb_webhook_deliveries_total"
        moved = s.value(delivered, outcome="delivered") > before.value(
            delivered, outcome="delivered"
        )
        return moved and s

    after = wait_until(counted, 30, "the delivered webhook on /metrics")
    labels = {"deployment": served, "outcome": "succeeded"}
    assert after.value("ebb_jobs_total", **labels) == before.value("ebb_jobs_total", **labels) + 1


def test_a_tenant_finds_no_prefix_another_tenant_cached(platform, admin):
    deploy(admin, "salted", "fake://s?step_ms=1", idle_timeout_s=600)
    long = [{"role": "user", "content": "the same long system prompt " * 30}]
    body = {"model": "salted", "messages": long, "max_tokens": 1}
    tenants = {t: tenant_client(platform, new_key(admin, t)) for t in ("salt-a", "salt-b")}
    # A ready runner first (the admin's prompts are salted apart from both tenants').
    wait_until(lambda: chat(admin, "salted", 1).status_code == 200, 60, "a ready runner")

    def queried_above(tokens: float):
        def check():
            s = scrape(admin)
            seen = s.value("ebb_prefix_cache_queried_tokens_total", deployment="salted")
            return seen > tokens and s

        return check

    warmed = wait_until(queried_above(0), 10, "the warm-up's prefix-cache figures")
    seen = warmed.value("ebb_prefix_cache_queried_tokens_total", deployment="salted")
    hits = []
    for tenant in ("salt-a", "salt-b", "salt-a"):
        answered = tenants[tenant].post("/v1/chat/completions", json=body)
        assert answered.status_code == 200, answered.text
        s = wait_until(queried_above(seen), 10, "the runner's prefix-cache figures")
        seen = s.value("ebb_prefix_cache_queried_tokens_total", deployment="salted")
        hits.append(s.value("ebb_prefix_cache_hit_tokens_total", deployment="salted"))
    for client in tenants.values():
        client.close()
    # salt-b's identical prompt found nothing of salt-a's; salt-a's second found its own.
    assert hits[0] == hits[1], hits
    assert hits[2] > hits[1], hits
