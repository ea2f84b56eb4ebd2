"""Skipping the reserve script for callers without a budget: a caller whose key and
tenant have none makes no budget call at all; a budget set elsewhere is applied once the
presence snapshot is a second old (the stated bound), at once on the frontdoor that set
it; and the reaper's rules (what it keeps, releases or settles to the billed cost)."""

from __future__ import annotations

import asyncio

import pytest

from ebb.coldstart.budget_reaper import Verdict, verdict
from ebb.frontdoor.budget_presence import FRESH_S, BudgetPresence
from ebb.frontdoor.budgets import BudgetGate
from ebb.frontdoor.caller import Caller
from ebb.queue.budget_holds import HeldRequest
from ebb.queue.budget_schema import BudgetHoldRecord
from ebb.queue.budgets import BudgetOutcome
from ebb.queue.schema import SamplingSpec, WorkItem

CALLER = Caller(tenant="t", key_id="k", is_admin=False)


class FakeReads:
    """The budgets hash and its version, as lua/budget_set.lua keeps them."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.version_now = 0
        self.reads = 0

    def set(self, subject: str) -> None:
        self.names.add(subject)
        self.version_now += 1

    async def version(self) -> int:
        self.reads += 1
        return self.version_now

    async def subjects(self) -> tuple[int, frozenset[str]]:
        self.reads += 1
        return self.version_now, frozenset(self.names)


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


class CountingStore:
    def __init__(self) -> None:
        self.reserves = 0

    async def reserve(self, *args: object, **kwargs: object) -> BudgetOutcome:
        self.reserves += 1
        return BudgetOutcome("none")


def _work() -> WorkItem:
    return WorkItem(
        request_id="r",
        deployment="m",
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingSpec(max_tokens=4),
        tenant="t",
        enqueued_at_s=0.0,
    )


def _presence() -> tuple[BudgetPresence, FakeReads, Clock]:
    reads, clock = FakeReads(), Clock()
    return BudgetPresence(reads, clock=clock), reads, clock  # type: ignore[arg-type]


def test_a_caller_without_a_budget_never_reaches_the_reserve_script():
    presence, reads, _ = _presence()
    store = CountingStore()
    gate = BudgetGate(store, presence=presence)  # type: ignore[arg-type]

    async def admit_many() -> list[object]:
        return [await gate.reserve(CALLER, _work()) for _ in range(100)]

    assert asyncio.run(admit_many()) == [None] * 100
    assert store.reserves == 0
    assert reads.reads == 2  # the version and the subjects, once for the second


def test_a_budget_set_elsewhere_applies_within_the_stated_bound():
    presence, reads, clock = _presence()
    assert not asyncio.run(presence.applies("key:k", "tenant:t"))
    reads.set("tenant:t")  # another frontdoor served the PUT
    clock.now_s += FRESH_S / 2
    assert not asyncio.run(presence.applies("key:k", "tenant:t"))  # within the bound
    clock.now_s += FRESH_S / 2
    assert asyncio.run(presence.applies("key:k", "tenant:t"))
    before = reads.reads
    clock.now_s += FRESH_S
    assert asyncio.run(presence.applies("key:k", "tenant:t"))
    assert reads.reads == before + 1, "an unchanged version is one read, not the subjects"


def test_the_frontdoor_that_set_a_budget_applies_it_at_once():
    presence, reads, _ = _presence()
    assert not asyncio.run(presence.applies("key:k", "tenant:t"))
    reads.set("key:k")
    presence.forget()
    assert asyncio.run(presence.applies("key:k", "tenant:t"))


def _held(state: str | None, *, alive: bool, error: str | None = None, billed=False):
    hold = BudgetHoldRecord(
        request_id="r",
        tenant="t",
        owner="fd",
        reserved_micros=100,
        reserved_at_s=0.0,
        price_in=1,
        price_out=1,
        subjects=["tenant:t"],
        spend_keys=["s"],
    )
    counts = (3, 4) if billed else (None, None)
    return HeldRequest(hold, state, error, *counts, owner_alive=alive)


@pytest.mark.parametrize(
    ("held", "ended_for_s", "expected"),
    [
        (_held("claimed", alive=False), None, Verdict.KEEP),  # runs on, billed at its end
        (_held("queued", alive=False), None, Verdict.KEEP),
        (_held(None, alive=False), None, Verdict.RELEASE),  # never queued
        (_held("done", alive=False, billed=True), None, Verdict.BILL),
        (_held("failed", alive=False, error="runner_lost"), None, Verdict.RELEASE),
        (_held(None, alive=True), None, Verdict.KEEP),  # its frontdoor is queueing it
        (_held("failed", alive=True, error="runner_lost"), 99.0, Verdict.KEEP),
        (_held("done", alive=True, billed=True), 1.0, Verdict.KEEP),  # settling now
        (_held("done", alive=True, billed=True), 30.0, Verdict.BILL),  # its settle was lost
        (_held("cancelled", alive=True), 30.0, Verdict.RELEASE),
    ],
)
def test_what_the_reaper_does_with_a_hold(held, ended_for_s, expected):
    assert verdict(held, ended_for_s=ended_for_s, grace_s=30.0) is expected
