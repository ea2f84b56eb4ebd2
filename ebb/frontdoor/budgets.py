"""Spend caps at admission: reserve a request's maximum cost, settle its real cost.

A request reserves what it could cost at most (its prompt and `max_tokens` × `n`
completion tokens at its deployment's prices, rounded as billing rounds) against its API
key's and its tenant's budgets before it is queued; a 429 `insufficient_quota` refuses it
when either has not that much left this period. When it ends the reservation is replaced
by what it really cost (the engine's counts, else the prompt and the tokens streamed) or,
if it never ran, given back. Because every admission holds its worst case, the spend of
all frontdoors together never passes a budget. The admin key has no budget.

A synchronous request's reservation is registered as a hold owned by this frontdoor
process (`owner`, which heartbeats while it runs): if the process dies before settling,
the controller's budget reaper settles it (ebb.coldstart.budget_reaper). A job's travels
in its job record to the collector instead.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from ebb.billing.pricing import format_micros, token_cost_micros
from ebb.errors import InsufficientQuota
from ebb.frontdoor.budget_presence import BudgetPresence
from ebb.frontdoor.caller import Caller
from ebb.queue.budget_periods import iso, resets_at
from ebb.queue.budget_schema import Budget, BudgetHoldRecord, BudgetReservation
from ebb.queue.budgets import BudgetOutcome, BudgetStore
from ebb.queue.ratelimits import key_subject, tenant_subject
from ebb.queue.schema import WorkItem

log = logging.getLogger(__name__)


def max_cost_micros(work: WorkItem) -> int:
    """The most `work` can be billed: its prompt and every completion token it may make."""
    s = work.sampling
    return token_cost_micros(
        len(work.prompt_token_ids),
        s.max_tokens * s.n,
        work.price_per_1m_input_tokens_micros,
        work.price_per_1m_output_tokens_micros,
    )


def cost_micros(work: WorkItem, prompt_tokens: int, completion_tokens: int) -> int:
    """What billing charges for these counts (the ledger prices each request alike)."""
    return token_cost_micros(
        prompt_tokens,
        completion_tokens,
        work.price_per_1m_input_tokens_micros,
        work.price_per_1m_output_tokens_micros,
    )


@dataclass
class BudgetHold:
    """One admitted request's reservation against the budgets that applied to it."""

    store: BudgetStore
    work: WorkItem
    reservation: BudgetReservation
    # The budgets it was reserved against ({subject: budget}): settling needs them.
    budgets: dict[str, Budget] = field(default_factory=dict)
    _settled: bool = False

    async def settle(self, cost: int | None) -> None:
        """Once: `cost` (micros) replaces the reservation; None releases it (never ran).
        Never raises: a reservation left over holds budget until its period ends, which
        errs on the side of the cap."""
        if self._settled:
            return
        self._settled = True
        await self.store.settle_quietly(
            self.reservation,
            tenant=self.work.tenant,
            cost_micros=cost,
            what=self.work.request_id,
            budgets=self.budgets,
        )


class BudgetGate:
    def __init__(
        self, store: BudgetStore, *, owner: str = "", presence: BudgetPresence | None = None
    ):
        """`owner`: this frontdoor process's id, as `beat_frontdoor` renews it;
        `presence`: which callers have no budget, to skip the script for (none: never)."""
        self._store = store
        self._owner = owner
        self._presence = presence

    async def reserve(self, caller: Caller, work: WorkItem) -> BudgetHold | None:
        """Reserve `work`'s maximum cost; None when no budget applies (or the admin).
        Raises InsufficientQuota (429) when a budget has not that much left."""
        if caller.is_admin:
            return None
        key, tenant = key_subject(caller.key_id), tenant_subject(caller.tenant)
        if self._presence is not None and not await self._presence.applies(key, tenant):
            return None
        cost = max_cost_micros(work)
        now_s = time.time()
        outcome = await self._store.reserve(
            key, tenant, cost, now_s=now_s, hold=self._hold(work, cost, now_s)
        )
        if outcome.status == "refused":
            raise InsufficientQuota(refusal_message(outcome, cost, now_s))
        if outcome.reservation is None:
            return None
        return BudgetHold(self._store, work, outcome.reservation, outcome.budgets)

    def _hold(self, work: WorkItem, cost: int, now_s: float) -> BudgetHoldRecord | None:
        """What the reaper needs to settle `work` without us (none for a job)."""
        if work.job_id:
            return None
        return BudgetHoldRecord(
            request_id=work.request_id,
            tenant=work.tenant,
            owner=self._owner,
            reserved_micros=cost,
            reserved_at_s=now_s,
            price_in=work.price_per_1m_input_tokens_micros,
            price_out=work.price_per_1m_output_tokens_micros,
            subjects=[],
            spend_keys=[],
        )


def refusal_message(outcome: BudgetOutcome, cost: int, now_s: float) -> str:
    kind, _, name = outcome.subject.partition(":")
    who = f"API key {name}" if kind == "key" else f"tenant {name!r}"
    left = max(0, outcome.amount_micros - outcome.committed_micros)
    reset = resets_at(outcome.period, now_s)
    when = (
        f"It resets at {iso(reset)} (the {outcome.period} budget's period, UTC)."
        if reset
        else "It is a lifetime budget and does not reset."
    )
    return (
        f"The budget of {who} is used up: {format_micros(left)} of "
        f"{format_micros(outcome.amount_micros)} left, and this request may cost up to "
        f"{format_micros(cost)}. {when} Lower max_tokens, or ask for a higher budget."
    )
