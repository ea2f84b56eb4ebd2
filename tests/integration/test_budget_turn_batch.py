"""The spend-cap scripts in the frontdoor's per-turn pipeline: reserves sent together
still each get their own answer (the budget admits exactly as many as fit), a reserve
answers the budgets it checked, and a settle given them reads nothing else yet builds its
soft-limit webhook from the budget as it is when it settles."""

from __future__ import annotations

import asyncio
import datetime as dt

import msgspec
import pytest
from redis import asyncio as aioredis

from ebb.queue import keys
from ebb.queue.budget_periods import Period
from ebb.queue.budget_schema import Budget
from ebb.queue.budgets import BudgetStore
from ebb.queue.turn_batch import TurnBatch

pytestmark = pytest.mark.integration

KEY, TENANT = "key:k1", "tenant:acme"
NOON_S = dt.datetime(2026, 12, 6, 12, tzinfo=dt.UTC).timestamp()


def _run(redis_url, test):
    async def main():
        client = aioredis.Redis.from_url(redis_url)
        try:
            await test(client, BudgetStore(client, delivery_ttl_s=3600, batch=TurnBatch(client)))
        finally:
            await client.aclose()

    asyncio.run(main())


def test_reserves_sent_together_each_get_their_own_answer(redis_url):
    async def test(client, store: BudgetStore):
        await store.set_budget(TENANT, Budget(amount_micros=100, period=Period.MONTH))
        await store.reserve("key:k0", "tenant:free", 1, now_s=NOON_S)  # loads the script
        alone = client.execute_command
        singles: list[tuple] = []

        async def sent_alone(*args, **kwargs):
            singles.append(args)
            return await alone(*args, **kwargs)

        client.execute_command = sent_alone
        outcomes = await asyncio.gather(
            *(store.reserve(KEY, TENANT, 30, now_s=NOON_S) for _ in range(5))
        )
        assert singles == [], "the five reserves went out as one pipeline"
        assert [o.status for o in outcomes] == ["ok", "ok", "ok", "refused", "refused"]
        assert [o.committed_micros for o in outcomes[3:]] == [90, 90]
        spend = await store.spend(TENANT, Budget(amount_micros=100, period=Period.MONTH),
                                  now_s=NOON_S)  # fmt: skip
        assert spend.reserved_micros == 90

    _run(redis_url, test)


def test_a_reserve_answers_the_budgets_it_was_checked_against(redis_url):
    async def test(client, store: BudgetStore):
        key_budget = Budget(amount_micros=500, period=Period.DAY, soft_limit=0.5)
        tenant_budget = Budget(amount_micros=1000, period=Period.MONTH)
        await store.set_budget(KEY, key_budget)
        await store.set_budget(TENANT, tenant_budget)
        both = await store.reserve(KEY, TENANT, 10, now_s=NOON_S)
        assert both.budgets == {KEY: key_budget, TENANT: tenant_budget}
        tenant_only = await store.reserve("key:k2", TENANT, 10, now_s=NOON_S)
        assert tenant_only.budgets == {TENANT: tenant_budget}
        assert (await store.reserve("key:k3", "tenant:free", 10, now_s=NOON_S)).budgets == {}

    _run(redis_url, test)


def test_a_settle_given_its_budgets_reads_none_and_reports_the_budget_as_it_is(redis_url):
    async def test(client, store: BudgetStore):
        await store.set_budget(TENANT, Budget(amount_micros=1000, soft_limit=0.5))
        await store.set_tenant_webhook("acme", "https://hooks.example/ebb")
        held = await store.reserve(KEY, TENANT, 600, now_s=NOON_S)
        assert held.reservation is not None
        # The admin lowers the budget while the request runs.
        await store.set_budget(TENANT, Budget(amount_micros=900, soft_limit=0.6))

        async def no_read(subjects):
            raise AssertionError(f"settle read the budgets of {subjects} again")

        store.budgets = no_read
        notified = await store.settle(
            held.reservation, tenant="acme", cost_micros=600, budgets=held.budgets
        )
        assert notified == [TENANT]
        (due,) = await client.zrange(keys.DELIVERIES_DUE, 0, -1)
        body = msgspec.json.decode(await client.hget(keys.delivery(due.decode()), "body"))
        assert (body["data"]["amount_micros"], body["data"]["soft_limit"]) == (900, 0.6)
        assert body["data"]["spent_micros"] == 600

    _run(redis_url, test)
