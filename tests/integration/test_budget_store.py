"""The spend-cap scripts on a real Redis: a reservation takes from the key's and the
tenant's budgets both or neither, settles to the real cost or is released, a new period
starts from zero, and the soft-limit delivery is created once per period however many
settles race for it."""

from __future__ import annotations

import asyncio
import datetime as dt

import msgspec
import pytest
from redis import asyncio as aioredis

from ebb.queue import keys
from ebb.queue.budget_periods import Period, period_label
from ebb.queue.budget_schema import Budget, BudgetReservation
from ebb.queue.budgets import BudgetStore

pytestmark = pytest.mark.integration

KEY, TENANT = "key:k1", "tenant:acme"
NOON_S = dt.datetime(2026, 12, 6, 12, tzinfo=dt.UTC).timestamp()


def _run(redis_url, test):
    async def main():
        client = aioredis.Redis.from_url(redis_url)
        try:
            await test(client, BudgetStore(client, delivery_ttl_s=3600))
        finally:
            await client.aclose()

    asyncio.run(main())


async def _reserve(store: BudgetStore, cost: int, now_s: float = NOON_S):
    return await store.reserve(KEY, TENANT, cost, now_s=now_s)


def test_a_reservation_takes_from_both_budgets_or_from_neither(redis_url):
    async def test(client, store: BudgetStore):
        await store.set_budget(KEY, Budget(amount_micros=100, period=Period.DAY))
        await store.set_budget(TENANT, Budget(amount_micros=1000, period=Period.MONTH))
        first = await _reserve(store, 60)
        assert first.status == "ok" and first.reservation is not None
        assert first.reservation.subjects == [KEY, TENANT]
        refused = await _reserve(store, 60)  # the key has 40 left
        assert (refused.status, refused.subject, refused.committed_micros) == ("refused", KEY, 60)
        tenant = await store.spend(TENANT, Budget(amount_micros=1000, period=Period.MONTH),
                                   now_s=NOON_S)  # fmt: skip
        assert tenant.reserved_micros == 60  # the refusal took nothing from the tenant
        await store.settle(first.reservation, tenant="acme", cost_micros=25)
        key = await store.spend(KEY, Budget(amount_micros=100, period=Period.DAY), now_s=NOON_S)
        assert (key.spent_micros, key.reserved_micros) == (25, 0)
        assert (await _reserve(store, 75)).status == "ok"  # exactly the rest fits
        assert (await _reserve(store, 1)).status == "refused"

    _run(redis_url, test)


def test_a_released_reservation_gives_everything_back(redis_url):
    async def test(client, store: BudgetStore):
        await store.set_budget(TENANT, Budget(amount_micros=50))
        held = await _reserve(store, 50)
        assert (await _reserve(store, 1)).status == "refused"
        await store.settle(held.reservation, tenant="acme", cost_micros=None)
        spend = await store.spend(TENANT, Budget(amount_micros=50))
        assert (spend.spent_micros, spend.reserved_micros) == (0, 0)
        assert (await _reserve(store, 50)).status == "ok"
        assert (await _reserve(store, 0, now_s=NOON_S)).status == "ok"  # free stays free

    _run(redis_url, test)


@pytest.mark.parametrize(
    ("period", "next_period_s"),
    [
        (Period.DAY, dt.datetime(2026, 12, 7, tzinfo=dt.UTC).timestamp()),
        (Period.MONTH, dt.datetime(2027, 1, 1, tzinfo=dt.UTC).timestamp()),
    ],
)
def test_a_new_period_starts_from_zero(redis_url, period, next_period_s):
    async def test(client, store: BudgetStore):
        await store.set_budget(TENANT, Budget(amount_micros=10, period=period))
        assert (await _reserve(store, 10)).status == "ok"
        assert (await _reserve(store, 1, now_s=next_period_s - 0.001)).status == "refused"
        again = await _reserve(store, 10, now_s=next_period_s)
        assert again.status == "ok" and again.reservation is not None
        assert again.reservation.spend_keys == [
            keys.budget_spend(TENANT, period_label(period, next_period_s))
        ]
        assert await client.ttl(again.reservation.spend_keys[0]) > 0  # it expires in time

    _run(redis_url, test)


def test_the_soft_limit_delivery_is_created_once_however_many_settles_race(redis_url):
    async def test(client, store: BudgetStore):
        await store.set_budget(TENANT, Budget(amount_micros=1000, soft_limit=0.5))
        await store.set_tenant_webhook("acme", "https://hooks.example/ebb")
        held = [(await _reserve(store, 20)).reservation for _ in range(40)]
        notified = await asyncio.gather(
            *(store.settle(r, tenant="acme", cost_micros=20) for r in held)
        )
        assert sum(len(n) for n in notified) == 1
        due = await client.zrange(keys.DELIVERIES_DUE, 0, -1)
        assert len(due) == 1
        record = await client.hgetall(keys.delivery(due[0].decode()))
        assert record[b"event"] == b"budget.soft_limit_reached"
        assert record[b"url"] == b"https://hooks.example/ebb"
        body = msgspec.json.decode(record[b"body"])
        assert 500 <= body["data"]["spent_micros"] < 520  # the settle that crossed it

    _run(redis_url, test)


def test_a_settle_after_its_record_expired_recreates_nothing(redis_url):
    async def test(client, store: BudgetStore):
        await store.set_budget(TENANT, Budget(amount_micros=10, period=Period.DAY))
        held = await _reserve(store, 10)
        assert isinstance(held.reservation, BudgetReservation)
        await client.delete(*held.reservation.spend_keys)
        await store.settle(held.reservation, tenant="acme", cost_micros=5)
        assert not await client.exists(*held.reservation.spend_keys)

    _run(redis_url, test)
