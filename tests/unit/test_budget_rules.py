"""Spend caps' pure rules: what a budget body accepts (a 400 naming the field otherwise),
a request's maximum cost (never less than what billing charges it), and the refusal's
message (whose budget, how much is left, when it resets)."""

from __future__ import annotations

import datetime as dt

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from ebb.billing.pricing import token_cost_micros
from ebb.errors import InsufficientQuota
from ebb.frontdoor.budgets import cost_micros, max_cost_micros, refusal_message
from ebb.frontdoor.errors_http import error_response, validation_error
from ebb.frontdoor.observe import outcome_of
from ebb.frontdoor.routes_limits import RateLimitsBody, TenantLimitsBody
from ebb.queue.budget_periods import Period
from ebb.queue.budgets import BudgetOutcome
from ebb.queue.schema import SamplingSpec, WorkItem


def _refusal(body: dict, model=RateLimitsBody):
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    errors = [{**e, "loc": ("body", *e["loc"])} for e in caught.value.errors()]
    return validation_error(RequestValidationError(errors))


@pytest.mark.parametrize(
    ("budget", "param"),
    [
        ({"amount_micros": -1}, "budget.amount_micros"),
        ({"amount_micros": "5"}, "budget.amount_micros"),
        ({"amount_micros": 1.5}, "budget.amount_micros"),
        ({"amount_micros": 10**16}, "budget.amount_micros"),
        ({}, "budget.amount_micros"),
        ({"amount_micros": 5, "period": "week"}, "budget.period"),
        ({"amount_micros": 5, "soft_limit": 0}, "budget.soft_limit"),
        ({"amount_micros": 5, "soft_limit": 1.5}, "budget.soft_limit"),
        ({"amount_micros": 5, "currency": "usd"}, "budget.currency"),
        ("ten dollars", "budget"),
    ],
)
def test_a_malformed_budget_is_a_400_naming_the_field(budget, param):
    error = _refusal({"budget": budget})
    assert error.status_code == 400
    assert error.param == param
    assert param in error.message


def test_a_budget_body_defaults_to_a_lifetime_with_a_soft_limit_of_80_percent():
    body = RateLimitsBody.model_validate({"budget": {"amount_micros": 5_000_000}})
    assert body.budget is not None
    budget = body.budget.budget()
    assert (budget.amount_micros, budget.period, budget.soft_limit) == (
        5_000_000,
        Period.LIFETIME,
        0.8,
    )
    month = RateLimitsBody.model_validate({"budget": {"amount_micros": 1, "period": "month"}})
    assert month.budget is not None and month.budget.budget().period is Period.MONTH


def test_leaving_the_budget_out_is_not_the_same_as_removing_it():
    rpm_only = RateLimitsBody.model_validate({"requests_per_minute": 5})
    assert "budget" not in rpm_only.model_fields_set
    assert "budget" in RateLimitsBody.model_validate({"budget": None}).model_fields_set


def test_only_a_tenant_takes_a_webhook_url():
    assert TenantLimitsBody.model_validate({"webhook_url": "https://x.example/h"}).webhook_url
    assert _refusal({"webhook_url": "https://x.example/h"}).param == "webhook_url"


def _work(prompt: int, max_tokens: int, n: int = 1) -> WorkItem:
    return WorkItem(
        request_id="r",
        deployment="m",
        prompt_token_ids=list(range(prompt)),
        sampling=SamplingSpec(max_tokens=max_tokens, n=n),
        tenant="t",
        enqueued_at_s=0.0,
        price_per_1m_input_tokens_micros=500_000,
        price_per_1m_output_tokens_micros=1_500_000,
    )


def test_the_maximum_cost_bounds_every_cost_billing_can_charge():
    work = _work(prompt=333, max_tokens=77, n=3)
    top = max_cost_micros(work)
    assert top == token_cost_micros(333, 231, 500_000, 1_500_000)
    assert all(cost_micros(work, 333, used) <= top for used in range(0, 232))
    assert cost_micros(work, 333, 231) == top


def test_the_refusal_says_whose_budget_what_is_left_and_when_it_resets():
    outcome = BudgetOutcome(
        "refused",
        subject="tenant:acme",
        amount_micros=2_000_000,
        committed_micros=1_500_000,
        period=Period.DAY,
    )
    now_s = dt.datetime(2026, 12, 6, 12, tzinfo=dt.UTC).timestamp()
    message = refusal_message(outcome, 600_000, now_s)
    assert "tenant 'acme'" in message
    assert "0.500000 of 2.000000 left" in message
    assert "0.600000" in message
    assert "2026-12-07T00:00:00Z" in message
    lifetime = BudgetOutcome("refused", subject="key:k1", amount_micros=1, period=Period.LIFETIME)
    assert "does not reset" in refusal_message(lifetime, 2, now_s)
    assert "API key k1" in refusal_message(lifetime, 2, now_s)


def test_insufficient_quota_is_openais_429_and_tells_clients_not_to_retry():
    response = error_response(InsufficientQuota("over"))
    assert response.status_code == 429
    assert response.headers["x-should-retry"] == "false"
    assert b'"type":"insufficient_quota"' in response.body
    assert b'"code":"insufficient_quota"' in response.body


def test_a_spend_caps_refusal_is_counted_apart_from_rate_limits():
    assert outcome_of(429, "insufficient_quota") == ("rate_limited", "insufficient_quota")
    assert outcome_of(429, "rate_limit_exceeded") == ("rate_limited", "429")
