"""The typed records of spend caps: a budget as the admin set it, and one request's (or
job's) reservation against the budgets that applied to it, which whoever settles it (the
frontdoor for a request, the job collector for a job) reads back."""

from __future__ import annotations

import msgspec

from ebb.queue.budget_periods import Period

DEFAULT_SOFT_LIMIT = 0.8


class Budget(msgspec.Struct, kw_only=True, frozen=True):
    amount_micros: int
    period: Period = Period.LIFETIME
    soft_limit: float = DEFAULT_SOFT_LIMIT  # a fraction of the amount


class BudgetReservation(msgspec.Struct, kw_only=True, frozen=True):
    """What one admission took: `reserved_micros` from each of `subjects`' spend hashes
    (`spend_keys`, pairwise: the key's before the tenant's), at `reserved_at_s`."""

    reserved_micros: int
    reserved_at_s: float
    subjects: list[str]
    spend_keys: list[str]
    # The request id its hold is registered under (keys.BUDGET_HOLDS): settling removes
    # it, so the frontdoor's settle and the reaper's never both apply. "" for a job's
    # reservation, which its job record carries to the collector instead.
    hold_id: str = ""


class BudgetHoldRecord(msgspec.Struct, kw_only=True, frozen=True):
    """A synchronous request's reservation as registered for the reaper (written by
    lua/budget_reserve.lua): enough to settle it without its frontdoor, at the prices the
    request was admitted at."""

    request_id: str
    tenant: str
    owner: str  # the frontdoor process that reserved it (keys.frontdoor_alive)
    reserved_micros: int
    reserved_at_s: float
    price_in: int  # per 1M input tokens, micros
    price_out: int  # per 1M output tokens, micros
    subjects: list[str]
    spend_keys: list[str]

    def reservation(self) -> BudgetReservation:
        return BudgetReservation(
            reserved_micros=self.reserved_micros,
            reserved_at_s=self.reserved_at_s,
            subjects=self.subjects,
            spend_keys=self.spend_keys,
            hold_id=self.request_id,
        )
