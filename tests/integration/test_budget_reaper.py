"""The budget reaper on a real Redis: a synchronous request's reservation is registered as
a hold with the charge; once its frontdoor is gone the reaper releases it (never queued,
or never billed) or settles it to what was billed; it keeps what is still running and
what a live frontdoor may still settle; and a reservation is settled once, whoever
settles first (the frontdoor or the reaper)."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis import asyncio as aioredis

from ebb.coldstart.budget_reaper import BudgetReaper, Verdict
from ebb.queue import keys
from ebb.queue.budget_holds import BudgetHolds, beat_frontdoor
from ebb.queue.budget_periods import Period
from ebb.queue.budget_schema import Budget, BudgetHoldRecord
from ebb.queue.budgets import BudgetStore

pytestmark = pytest.mark.integration

KEY, TENANT = "key:rk1", "tenant:reaped"
BUDGET = Budget(amount_micros=10_000, period=Period.LIFETIME)
PRICES = (1_000_000, 2_000_000)  # one micro a prompt token, two a completion token


def _run(redis_url, test):
    async def main():
        client = aioredis.Redis.from_url(redis_url)
        requests = [keys.request(f"req-{n}") for n in ("running", "lost", "ended", "billed")]
        spend = [keys.budget_spend(s, "life") for s in (KEY, TENANT)]
        await client.delete(keys.BUDGET_HOLDS, keys.BUDGET_HOLDS_AT, *requests, *spend)
        store = BudgetStore(client, delivery_ttl_s=3600)
        await store.set_budget(TENANT, BUDGET)
        try:
            await test(client, store, BudgetReaper(BudgetHolds(client), store))
        finally:
            await client.aclose()

    asyncio.run(main())


def _hold(request_id: str, owner: str, cost: int) -> BudgetHoldRecord:
    return BudgetHoldRecord(
        request_id=request_id,
        tenant="reaped",
        owner=owner,
        reserved_micros=cost,
        reserved_at_s=time.time(),
        price_in=PRICES[0],
        price_out=PRICES[1],
        subjects=[],
        spend_keys=[],
    )


async def _reserve(store: BudgetStore, request_id: str, owner: str, cost: int):
    outcome = await store.reserve(
        KEY, TENANT, cost, now_s=time.time(), hold=_hold(request_id, owner, cost)
    )
    assert outcome.reservation is not None
    return outcome.reservation


async def _age_holds(client: aioredis.Redis) -> None:
    """As if every hold was made a minute ago (the reaper skips the newest)."""
    for member, score in await client.zrange(keys.BUDGET_HOLDS_AT, 0, -1, withscores=True):
        await client.zadd(keys.BUDGET_HOLDS_AT, {member: score - 60_000})


async def _spend(store: BudgetStore) -> tuple[int, int]:
    spend = await store.spend(TENANT, BUDGET)
    return spend.spent_micros, spend.reserved_micros


def test_a_hold_is_registered_with_its_charge_and_removed_by_its_settle(redis_url):
    async def test(client, store, reaper):
        reservation = await _reserve(store, "req-a", "fd-live", 300)
        assert reservation.hold_id == "req-a"
        raw = await client.hget(keys.BUDGET_HOLDS, "req-a")
        assert b'"spend_keys":["' in raw and TENANT.encode() in raw
        await store.settle(reservation, tenant="reaped", cost_micros=120)
        await store.settle(reservation, tenant="reaped", cost_micros=120)  # a second: nothing
        assert await client.hlen(keys.BUDGET_HOLDS) == 0
        assert await client.zcard(keys.BUDGET_HOLDS_AT) == 0
        assert await _spend(store) == (120, 0)

    _run(redis_url, test)


def test_a_dead_frontdoors_hold_for_a_request_never_queued_is_released(redis_url):
    async def test(client, store, reaper):
        await _reserve(store, "req-never", "fd-dead", 500)  # died before enqueueing it
        await _age_holds(client)
        assert await _spend(store) == (0, 500)
        assert await reaper.reap(time.monotonic()) == [("req-never", Verdict.RELEASE)]
        assert await _spend(store) == (0, 0)
        assert await reaper.reap(time.monotonic()) == []

    _run(redis_url, test)


def test_a_dead_frontdoors_billed_request_is_settled_to_its_billed_cost_once(redis_url):
    async def test(client, store, reaper):
        reservation = await _reserve(store, "req-billed", "fd-dead", 500)
        # A runner finished it (lua/finish.lua): 40 prompt and 25 completion tokens.
        await client.hset(
            keys.request("req-billed"),
            mapping={"state": "done", "prompt_tokens": 40, "completion_tokens": 25},
        )
        await _age_holds(client)
        assert await reaper.reap(time.monotonic()) == [("req-billed", Verdict.BILL)]
        assert await _spend(store) == (40 + 2 * 25, 0)
        # The frontdoor's own settle, had it come late, changes nothing.
        await store.settle(reservation, tenant="reaped", cost_micros=90)
        assert await _spend(store) == (90, 0)

    _run(redis_url, test)


def test_what_still_runs_or_a_live_frontdoor_may_settle_is_kept(redis_url):
    async def test(client, store, reaper):
        await beat_frontdoor(client, "fd-live")
        await _reserve(store, "req-running", "fd-dead", 100)
        await client.hset(keys.request("req-running"), "state", "claimed")
        await _reserve(store, "req-queueing", "fd-live", 100)  # not queued yet
        await _reserve(store, "req-lost", "fd-live", 100)  # its frontdoor may run it again
        await client.hset(
            keys.request("req-lost"), mapping={"state": "failed", "error": "runner_lost"}
        )
        await _reserve(store, "req-ended", "fd-live", 100)
        await client.hset(keys.request("req-ended"), "state", "cancelled")
        await _age_holds(client)
        now_s = time.monotonic()
        assert await reaper.reap(now_s) == []
        assert await _spend(store) == (0, 400)
        # A live frontdoor that has not settled an ended request 30 s on lost its settle.
        assert await reaper.reap(now_s + 31) == [("req-ended", Verdict.RELEASE)]
        assert await _spend(store) == (0, 300)

    _run(redis_url, test)
