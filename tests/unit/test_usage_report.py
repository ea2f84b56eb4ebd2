"""Usage reports from hourly aggregates: grouping, tenant filtering, unit economics."""

from __future__ import annotations

from ebb.billing.entries import HOUR_MS
from ebb.billing.gpu import PLATFORM_TENANT, meter_for
from ebb.billing.usage import UsageQuery, report
from ebb.queue.metering import POOL_DEPLOYMENT
from ebb.queue.schema import DeploymentSpec

DAY0 = 1_699_920_000_000  # 2023-11-14T00:00:00Z
AGGREGATES = {
    DAY0: {
        "acme|m|requests": 2,
        "acme|m|prompt_tokens": 40,
        "acme|m|completion_tokens": 400_000,
        "acme|m|token_cost_micros": 100,
        "acme|m|gpu_ms": 36_000,
        "acme|m|gpu_cost_micros": 36_000,
        "admin|(pool)|gpu_ms": 5_000,
    },
    DAY0 + 25 * HOUR_MS: {
        "beta|m|requests": 1,
        "beta|m|prompt_tokens": 10,
        "beta|m|completion_tokens": 100_000,
        "beta|m|token_cost_micros": 7,
    },
}


def query(**fields) -> UsageQuery:
    return UsageQuery(**{"start_ms": 0, "end_ms": DAY0 + 48 * HOUR_MS, **fields})


def test_grouped_by_deployment_with_a_total():
    body = report(AGGREGATES, query(), gpu_second_cost_micros=0)
    assert [r["deployment"] for r in body["data"]] == ["(pool)", "m"]
    m = body["data"][1]
    assert (m["requests"], m["prompt_tokens"], m["completion_tokens"]) == (3, 50, 500_000)
    assert m["gpu_seconds"] == 36.0 and m["cost_micros"] == 36_107
    total = body["total"]
    assert total["requests"] == 3 and total["gpu_ms"] == 41_000
    assert total["cost_micros"] == total["token_cost_micros"] + total["gpu_cost_micros"]


def test_grouped_by_tenant_and_day_and_filtered_to_one_tenant():
    body = report(AGGREGATES, query(group_by=("tenant", "day")), 0)
    assert [(r["tenant"], r["day"]) for r in body["data"]] == [
        ("acme", "2023-11-14"),
        ("admin", "2023-11-14"),
        ("beta", "2023-11-15"),
    ]
    only_beta = report(AGGREGATES, query(tenant="beta"), 0)
    assert only_beta["total"]["requests"] == 1 and only_beta["total"]["gpu_ms"] == 0
    assert only_beta["unit_economics"] == []


def test_the_window_selects_whole_hours():
    body = report(AGGREGATES, query(start_ms=DAY0 + HOUR_MS), 0)
    assert body["total"]["requests"] == 1


def test_unit_economics_cost_a_million_output_tokens_in_gpu_time():
    [m] = report(AGGREGATES, query(), gpu_second_cost_micros=1_000)["unit_economics"]
    # 36 GPU-seconds for 500k output tokens: 72 s per 1M, 72,000 micros at 1,000/s.
    assert m["deployment"] == "m"
    assert m["gpu_seconds_per_1m_output_tokens"] == 72.0
    assert m["gpu_cost_micros_per_1m_output_tokens"] == 72_000
    [unpriced] = report(AGGREGATES, query(), gpu_second_cost_micros=0)["unit_economics"]
    assert unpriced["gpu_cost_micros_per_1m_output_tokens"] is None


def test_gpu_count_and_attribution():
    assert [meter_for("r-1", None, held).gpu_count for held in (0, 1, 2)] == [1, 1, 2]
    spec = DeploymentSpec(name="m", source="fake://m", owner="acme", price_per_gpu_second_micros=9)
    assert meter_for("r-1", spec, 2).tenant == "acme"
    assert meter_for("r-1", spec, 2).price_per_gpu_second_micros == 9
    pool = meter_for("r-1", None, 1)
    assert (pool.deployment, pool.tenant) == (POOL_DEPLOYMENT, PLATFORM_TENANT)
