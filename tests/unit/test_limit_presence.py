"""Which callers have rate limits, cached at admission: a caller without one skips
ratelimit.lua, a limit set through this frontdoor applies at once, and the cache's
answers age out so that one set elsewhere applies within its period."""

from __future__ import annotations

import asyncio
from typing import Any

from ebb.frontdoor.caller import Caller
from ebb.frontdoor.limit_presence import _FRESH_S, LimitPresence
from ebb.frontdoor.ratelimit import RateLimiter
from ebb.queue.ratelimits import LimitOutcome, RateLimits
from ebb.queue.schema import SamplingSpec, WorkItem


class FakeStore:
    """A RateLimitStore whose limits are a set of subjects; counts the reads."""

    def __init__(self) -> None:
        self.changes = 0
        self.limited: set[str] = set()
        self.presence_reads = 0
        self.reserves = 0

    async def any_limit(self, key_id: str, tenant: str) -> bool:
        self.presence_reads += 1
        return bool({f"key:{key_id}", f"tenant:{tenant}"} & self.limited)

    async def set_limits(self, subject: str, limits: RateLimits) -> None:
        self.changes += 1
        self.limited.add(subject)

    async def reserve(self, key_id: str, tenant: str, tokens: int) -> LimitOutcome:
        self.reserves += 1
        return LimitOutcome("ok")

    async def adjust(self, *args: Any, **kwargs: Any) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_answer_serves_the_callers_next_requests_until_it_ages_out():
    store, clock = FakeStore(), Clock()
    presence = LimitPresence(store, clock)  # type: ignore[arg-type]

    async def twice() -> list[bool]:
        return [await presence.limited("k1", "t"), await presence.limited("k1", "t")]

    assert asyncio.run(twice()) == [False, False]
    assert store.presence_reads == 1
    store.limited.add("tenant:t")  # set through another frontdoor
    clock.now += _FRESH_S
    assert asyncio.run(presence.limited("k1", "t")) is True
    assert store.presence_reads == 2


def test_a_limit_set_through_this_frontdoor_applies_at_once():
    store, clock = FakeStore(), Clock()
    presence = LimitPresence(store, clock)  # type: ignore[arg-type]
    assert asyncio.run(presence.limited("k1", "t")) is False
    asyncio.run(store.set_limits("key:k1", RateLimits(requests_per_minute=1)))
    assert asyncio.run(presence.limited("k1", "t")) is True  # same instant: not aged out


def _work() -> WorkItem:
    return WorkItem(
        request_id="r1",
        deployment="d",
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingSpec(max_tokens=4),
        tenant="t",
        key_id="k1",
    )


def test_a_caller_without_limits_skips_the_script_and_one_with_them_does_not():
    store = FakeStore()
    limiter = RateLimiter(store)  # type: ignore[arg-type]
    caller = Caller(tenant="t", key_id="k1", is_admin=False)

    async def reserve() -> int:
        reservation = await limiter.reserve(caller, _work())
        await reservation.settle()
        return reservation.reserved_tokens

    assert asyncio.run(reserve()) == 0  # nothing taken from a limit, nothing to give back
    assert store.reserves == 0
    asyncio.run(store.set_limits("tenant:t", RateLimits(tokens_per_minute=100)))
    assert asyncio.run(reserve()) == 7
    assert store.reserves == 1
