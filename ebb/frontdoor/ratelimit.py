"""Rate limits at admission: requests and tokens per minute, per API key and per tenant.

A request reserves one request and its worst case in tokens (prompt + max_tokens × n)
before it is queued, and settles once it ends: a request that never ran (503, the client
left while it was queued) gets everything back; one that ran keeps what it really used,
the engine's counts when it finished, else the prompt and the tokens streamed so far.
The admin key is never limited. A request that runs no model (POST /tokenize and
/detokenize) takes one request and an estimate of its tokens (`reserve_count`), settled
to the tokens it counted; it has no price, so no spend cap. A request's spend cap
(`budgets.py`) is reserved and settled with its rate limits, through the same
`Reservation`.
"""

from __future__ import annotations

import logging
import math

from ebb.errors import InvalidRequest, RateLimited
from ebb.frontdoor.budgets import BudgetGate, BudgetHold, cost_micros
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.limit_presence import LimitPresence
from ebb.queue.budget_schema import BudgetReservation
from ebb.queue.ratelimits import LimitOutcome, RateLimitStore
from ebb.queue.schema import Finished, Progress, WorkItem

log = logging.getLogger(__name__)

_UNITS = {"rpm": "requests", "tpm": "tokens"}


class Reservation:
    """What one request took from its limits. `settle()` gives back what it did not use."""

    def __init__(self, store: RateLimitStore | None, work: WorkItem, reserved_tokens: int):
        self._store = store  # None: no limit applies, nothing to settle
        self._work = work
        self._reserved_tokens = reserved_tokens
        self.ran = False  # a runner claimed it
        self._streamed_tokens = 0
        self._final_tokens: int | None = None
        self._final_counts: tuple[int, int] | None = None  # prompt, completion
        self._settled = False
        self.budget: BudgetHold | None = None  # the spend caps' part, if any applied

    @property
    def reserved_tokens(self) -> int:
        """Tokens taken from a limit (0 when no limit applied: nothing to give back)."""
        return self._reserved_tokens if self._store is not None else 0

    @property
    def budget_reservation(self) -> BudgetReservation | None:
        """The spend caps' part, for a job to carry until the collector settles it."""
        return self.budget.reservation if self.budget is not None else None

    def observe(self, event: object) -> None:
        if isinstance(event, Progress):
            self._streamed_tokens += sum(c.token_count for c in event.choices)
        elif isinstance(event, Finished):
            self._final_tokens = event.prompt_tokens + event.completion_tokens
            self._final_counts = (event.prompt_tokens, event.completion_tokens)

    @property
    def settles_anything(self) -> bool:
        """False when `settle()` has nothing to do (no limit or spend cap applied, or it
        ran already): a caller may skip it, and the task shielding it."""
        return not self._settled and (self.budget is not None or self._store is not None)

    async def settle(self) -> None:
        """Once, whatever happened; never raises."""
        if self._settled:
            return
        self._settled = True
        if self.budget is not None:
            await self.budget.settle(self._cost_micros() if self.ran else None)
        if self._store is None:
            return
        if not self.ran:
            requests, tokens = 1, self._reserved_tokens
        else:
            used = self._final_tokens
            if used is None:
                used = len(self._work.prompt_token_ids) + self._streamed_tokens
            requests, tokens = 0, self._reserved_tokens - used
        if not (requests or tokens):
            return
        w = self._work
        try:
            await self._store.adjust(w.key_id, w.tenant, requests=requests, tokens=tokens)
        except Exception:  # the response is what matters; the bucket refills within a minute
            log.exception("frontdoor: could not settle the rate limits of %s", w.request_id)

    def _cost_micros(self) -> int:
        """What the request that ran is billed: the engine's counts, else what streamed."""
        prompt = len(self._work.prompt_token_ids)
        prompt, completion = self._final_counts or (prompt, self._streamed_tokens)
        return cost_micros(self._work, prompt, completion)


class CountReservation:
    """What a request that runs no model took: one request and `reserved_tokens`."""

    def __init__(self, store: RateLimitStore | None, caller: Caller, reserved_tokens: int):
        self._store = store  # None: no limit applies, nothing to settle
        self._caller = caller
        self._reserved_tokens = reserved_tokens

    async def settle(self, counted_tokens: int | None) -> None:
        """Keep the request and `counted_tokens` (None: it failed, the tokens go back);
        never raises. A count above the reservation takes the rest."""
        if self._store is None:
            return
        store, self._store = self._store, None  # once
        back = self._reserved_tokens - (counted_tokens or 0)
        if not back:
            return
        c = self._caller
        try:
            await store.adjust(c.key_id, c.tenant, requests=0, tokens=back)
        except Exception:  # the bucket refills within a minute
            log.exception("frontdoor: could not settle the token count of %s", c.key_id)


class RateLimiter:
    def __init__(self, store: RateLimitStore, budgets: BudgetGate | None = None):
        self._store = store
        self._budgets = budgets
        self._presence = LimitPresence(store)

    async def reserve(self, caller: Caller, work: WorkItem) -> Reservation:
        """Reserve for `work`; raises RateLimited (429), InsufficientQuota (429, a spend
        cap) or InvalidRequest (400, too large)."""
        if caller.is_admin:
            return Reservation(None, work, 0)
        reservation = await self._reserve_rate(caller, work)
        if self._budgets is not None:
            try:
                reservation.budget = await self._budgets.reserve(caller, work)
            except BaseException:
                await reservation.settle()  # refused: the rate limits get it all back
                raise
        return reservation

    async def reserve_count(self, caller: Caller, tokens: int, *, param: str) -> CountReservation:
        """One request and `tokens` for a request that runs no model; raises RateLimited
        (429) or InvalidRequest (400, more than a tokens-per-minute limit, naming `param`)."""
        if caller.is_admin or not await self._presence.limited(caller.key_id, caller.tenant):
            return CountReservation(None, caller, tokens)
        outcome = await self._store.reserve(caller.key_id, caller.tenant, tokens)
        _raise_if_limited(outcome, tokens)
        if outcome.status == "too_large":
            raise InvalidRequest(
                f"This request counts at least {tokens} tokens, more than the "
                f"{outcome.limit} tokens per minute allowed for {_who(outcome.subject)}. "
                f"Send a shorter {param}.",
                param=param,
            )
        return CountReservation(self._store if outcome.status == "ok" else None, caller, tokens)

    async def _reserve_rate(self, caller: Caller, work: WorkItem) -> Reservation:
        tokens = worst_case_tokens(work)
        if not await self._presence.limited(caller.key_id, caller.tenant):
            return Reservation(None, work, tokens)  # what the script answers: "none"
        outcome = await self._store.reserve(caller.key_id, caller.tenant, tokens)
        _raise_if_limited(outcome, tokens)
        if outcome.status == "too_large":
            raise InvalidRequest(_too_large_message(outcome, work, tokens), param="max_tokens")
        return Reservation(self._store if outcome.status == "ok" else None, work, tokens)


def worst_case_tokens(work: WorkItem) -> int:
    return len(work.prompt_token_ids) + work.sampling.max_tokens * work.sampling.n


def _who(subject: str) -> str:
    kind, _, name = subject.partition(":")
    return f"API key {name}" if kind == "key" else f"tenant {name!r}"


def _raise_if_limited(outcome: LimitOutcome, tokens: int) -> None:
    """RateLimited (429, with when to retry) for an outcome over a limit."""
    if outcome.status == "limited":
        raise RateLimited(
            _limited_message(outcome, tokens),
            retry_after_s=max(1, math.ceil(outcome.wait_ms / 1000)),
            code="rate_limit_exceeded",
        )


def _limited_message(outcome: LimitOutcome, tokens: int) -> str:
    unit = _UNITS[outcome.kind]
    wait_s = max(1, math.ceil(outcome.wait_ms / 1000))
    extra = f" (this request reserves {tokens} tokens)" if outcome.kind == "tpm" else ""
    return (
        f"Rate limit reached for {_who(outcome.subject)}: {outcome.limit} {unit} per "
        f"minute{extra}. Retry after {wait_s} s, or ask for a higher limit."
    )


def _too_large_message(outcome: LimitOutcome, work: WorkItem, tokens: int) -> str:
    s = work.sampling
    return (
        f"This request can use up to {tokens} tokens (prompt {len(work.prompt_token_ids)} + "
        f"max_tokens {s.max_tokens} × n {s.n}), more than the {outcome.limit} tokens per "
        f"minute allowed for {_who(outcome.subject)}. Lower max_tokens or shorten the prompt."
    )
