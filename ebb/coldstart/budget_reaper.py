"""The budget reaper: settles the spend-cap reservations their frontdoor left behind.

A synchronous request's frontdoor reserves its maximum cost and settles it when the
request ends. A frontdoor that dies in between (SIGKILL, its node gone) would leave the
reservation held until its period's spend expires, and for a lifetime budget for good,
locking the tenant out of its own budget. The controller's reap pass, which already
continues lost runners' requests, also runs this one every `interval_s`:

- a request still queued or running keeps its hold (it runs to its end without its
  frontdoor, and is billed then);
- once the owner frontdoor is gone (its heartbeat key expired) and the request has ended,
  or was never queued, the hold is settled: to the cost billed for it when a runner
  finished it (its token counts at the prices it was admitted at), else released;
- a request whose live frontdoor has not settled it `terminal_grace_s` after it was
  first seen ended (a settle lost to a Redis error) is settled the same way;
- a request failed as `runner_lost` keeps its hold while its frontdoor lives, which may
  still run it again under the same id.

Each settle removes its hold in the same script, so the frontdoor's settle and the
reaper's never both apply. Within a few heartbeat periods of a Redis start nothing is
reaped: frontdoors could not renew their keys while it was down.
"""

from __future__ import annotations

import logging
from enum import StrEnum

from ebb.billing.pricing import token_cost_micros
from ebb.coldstart.clock import SYSTEM_CLOCK, Clock
from ebb.queue import keys
from ebb.queue.budget_holds import BudgetHolds, HeldRequest
from ebb.queue.budgets import BudgetStore

log = logging.getLogger(__name__)

_LIVE_STATES = frozenset({"queued", "claimed"})
# A hold younger than this is not even read: its request has barely started.
_MIN_AGE_S = 2.0
# Frontdoors renew their keys every third of the TTL; after a Redis start, give them two.
_RESTART_GRACE_S = 2 * keys.FRONTDOOR_ALIVE_TTL_S


class Verdict(StrEnum):
    KEEP = "keep"
    RELEASE = "release"  # nothing was billed: all of it back
    BILL = "bill"  # settled to what its usage was billed


def verdict(held: HeldRequest, *, ended_for_s: float | None, grace_s: float) -> Verdict:
    """What to do with `held` now; `ended_for_s`: how long it has been seen ended (None:
    not seen ended before this pass)."""
    if held.state in _LIVE_STATES:
        return Verdict.KEEP
    billed = held.prompt_tokens is not None and held.completion_tokens is not None
    settled = Verdict.BILL if billed else Verdict.RELEASE
    if not held.owner_alive:
        return settled
    if held.state is None or (held.state == "failed" and held.error == "runner_lost"):
        return Verdict.KEEP  # its frontdoor is queueing it, or may run it again
    if ended_for_s is not None and ended_for_s >= grace_s:
        return settled
    return Verdict.KEEP


def billed_cost_micros(held: HeldRequest) -> int:
    """What billing charged for `held`'s request, at the prices it was admitted at."""
    return token_cost_micros(
        held.prompt_tokens or 0,
        held.completion_tokens or 0,
        held.hold.price_in,
        held.hold.price_out,
    )


class BudgetReaper:
    def __init__(
        self,
        holds: BudgetHolds,
        store: BudgetStore,
        *,
        interval_s: float = 2.0,
        terminal_grace_s: float = 30.0,
        clock: Clock = SYSTEM_CLOCK,
    ):
        self._holds = holds
        self._store = store
        self._interval_s = interval_s
        self._grace_s = terminal_grace_s
        self._clock = clock
        self._next_s = 0.0
        self._ended_since: dict[str, float] = {}  # request id -> first seen ended

    async def maybe_reap(self) -> list[tuple[str, Verdict]]:
        """One pass if `interval_s` has passed since the last; never raises."""
        now_s = self._clock.monotonic()
        if now_s < self._next_s:
            return []
        self._next_s = now_s + self._interval_s
        try:
            if await self._holds.redis_uptime_s() < _RESTART_GRACE_S:
                return []
            return await self.reap(now_s)
        except Exception:
            log.exception("coldstart: the budget reaper's pass failed")
            return []

    async def reap(self, now_s: float) -> list[tuple[str, Verdict]]:
        """Settle every hold left behind (see the module); what was done to which."""
        done: list[tuple[str, Verdict]] = []
        ended: dict[str, float] = {}
        for held in await self._holds.held(older_than_s=_MIN_AGE_S):
            request_id = held.hold.request_id
            since = None
            if held.state not in _LIVE_STATES and held.state is not None:
                ended[request_id] = self._ended_since.get(request_id, now_s)
                since = now_s - ended[request_id]
            outcome = verdict(held, ended_for_s=since, grace_s=self._grace_s)
            if outcome is Verdict.KEEP:
                continue
            cost = billed_cost_micros(held) if outcome is Verdict.BILL else None
            await self._store.settle_quietly(
                held.hold.reservation(),
                tenant=held.hold.tenant,
                cost_micros=cost,
                what=f"request {request_id} (reaped)",
            )
            ended.pop(request_id, None)
            done.append((request_id, outcome))
            log.warning(
                "coldstart: budget reservation of %s (frontdoor %s, %s) %s",
                request_id,
                held.hold.owner,
                "gone" if not held.owner_alive else "alive",
                "released" if cost is None else f"settled to its billed {cost} micros",
            )
        self._ended_since = ended
        return done
