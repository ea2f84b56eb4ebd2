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
