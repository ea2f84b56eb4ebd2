"""Spend caps in Redis: budgets of API keys and tenants, and what each spent per period.

A budget (`Budget`, in micros like every price) is configured per subject ("key:ID" or
"tenant:NAME", as rate limits are). Admission reserves a request's maximum cost against
the key's and the tenant's budgets in one script (lua/budget_reserve.lua); the request's
end settles it to the real cost, or releases it (lua/budget_settle.lua), which also sends
the soft-limit webhook once per period. Spend lives in one hash per subject and period
(`keys.budget_spend`): `committed` (spent + reserved by requests still running),
`spent`, and `soft` once the soft limit's webhook was created.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec
import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.budget_periods import Period, iso, period_label, period_start, resets_at
from ebb.queue.budget_schema import Budget, BudgetHoldRecord, BudgetReservation
from ebb.queue.job_schema import JobEvent
from ebb.queue.replies import reply_text, reply_texts
from ebb.queue.scripts import TurnBatchLike, register_async

log = logging.getLogger(__name__)
SOFT_LIMIT_EVENT = str(JobEvent.BUDGET_SOFT_LIMIT_REACHED)


class Spend(msgspec.Struct, kw_only=True, frozen=True):
    """A subject's spend in the current period of its budget."""

    spent_micros: int
    reserved_micros: int  # held by requests admitted and not yet settled
    period_start: str | None  # ISO instants, None for a lifetime budget
    resets_at: str | None


@dataclass(frozen=True)
class BudgetOutcome:
    status: str  # "none" (no budget applies), "ok" or "refused"
    reservation: BudgetReservation | None = None  # "ok": what to settle later
    subject: str = ""  # "refused": whose budget refused it
    amount_micros: int = 0
    committed_micros: int = 0
    period: Period = Period.LIFETIME
    # "ok": the budgets the reservation was checked against, {subject: budget}, which
    # settling it needs (passed back to `settle`, they spare it reading them again).
    budgets: dict[str, Budget] = field(default_factory=dict)


class BudgetStore:
    def __init__(
        self, client: aioredis.Redis, *, delivery_ttl_s: int, batch: TurnBatchLike | None = None
    ):
        """`batch`: the reserve and settle scripts join their loop turn's pipeline
        (`ebb.queue.turn_batch`; the frontdoor's, shared with its enqueues)."""
        self._redis = client
        self._reserve = register_async(client, "budget_reserve", batch)
        self._settle = register_async(client, "budget_settle", batch)
        self._set = register_async(client, "budget_set")
        self._delivery_ttl_s = delivery_ttl_s

    async def reserve(
        self,
        key_subject: str,
        tenant_subject: str,
        cost_micros: int,
        *,
        now_s: float,
        hold: BudgetHoldRecord | None = None,
    ) -> BudgetOutcome:
        """Add `cost_micros` to both subjects' committed spend this period, or to neither
        when it would take either past its budget. With `hold` (its subjects and spend
        keys left empty: the script fills them in) a reservation made is registered for
        the reaper in the same script, and settling it removes it."""
        spend_keys = [
            keys.budget_spend(subject, period_label(period, now_s))
            for subject in (key_subject, tenant_subject)
            for period in (Period.DAY, Period.MONTH, Period.LIFETIME)
        ]
        reply = reply_texts(
            await self._reserve(
                keys=[keys.BUDGETS, *spend_keys, keys.BUDGET_HOLDS, keys.BUDGET_HOLDS_AT],
                args=[
                    key_subject,
                    tenant_subject,
                    cost_micros,
                    keys.BUDGET_SPEND_TTL_S["day"],
                    keys.BUDGET_SPEND_TTL_S["month"],
                    "" if hold is None else msgspec.json.encode(hold).decode(),
                    "" if hold is None else hold.request_id,
                ],
            )
        )
        if reply[0] == "refused":
            return BudgetOutcome(
                "refused",
                subject=reply[1],
                amount_micros=int(reply[2]),
                committed_micros=int(reply[3]),
                period=Period(reply[4]),
            )
        if reply[0] == "ok":
            subjects = (key_subject, tenant_subject)
            charged = [(s, k) for s, k in zip(subjects, reply[1:3], strict=True) if k]
            reservation = BudgetReservation(
                reserved_micros=cost_micros,
                reserved_at_s=now_s,
                subjects=[s for s, _ in charged],
                spend_keys=[k for _, k in charged],
                hold_id="" if hold is None else hold.request_id,
            )
            budgets = {
                s: msgspec.json.decode(raw, type=Budget)
                for s, raw in zip(subjects, reply[3:5], strict=True)
                if raw
            }
            return BudgetOutcome("ok", reservation=reservation, budgets=budgets)
        return BudgetOutcome("none")

    async def settle(
        self,
        reservation: BudgetReservation,
        *,
        tenant: str,
        cost_micros: int | None,
        budgets: Mapping[str, Budget] | None = None,
    ) -> list[str]:
        """Replace the reservation by `cost_micros` (None: it never ran, release it all);
        the subjects whose soft-limit webhook this created. `budgets`: those its reserve
        answered (`BudgetOutcome.budgets`; None: read them here). The webhook's amount and
        soft limit are the budget's when the script runs, whichever were passed."""
        if budgets is None:
            budgets = await self.budgets(reservation.subjects)
        args: list[str | int] = [
            reservation.reserved_micros,
            -1 if cost_micros is None else cost_micros,
            tenant,
            keys.DELIVERY_PREFIX,
            self._delivery_ttl_s,
            keys.SIGNAL_LIST_MAX,
            reservation.hold_id,
        ]
        for subject in reservation.subjects:
            budget = budgets.get(subject) or Budget(amount_micros=0)
            body = soft_limit_body(subject, tenant, budget, reservation.reserved_at_s)
            args += [subject, f"msg_{uuid.uuid4().hex}", body]
        reply = await self._settle(
            keys=[
                keys.BUDGETS,
                keys.TENANT_WEBHOOKS,
                keys.DELIVERIES_DUE,
                keys.DELIVERIES_SIGNAL,
                keys.BUDGET_HOLDS,
                keys.BUDGET_HOLDS_AT,
                *reservation.spend_keys,
            ],
            args=args,
        )
        return reply_texts(reply)

    async def settle_quietly(
        self,
        reservation: BudgetReservation,
        *,
        tenant: str,
        cost_micros: int | None,
        what: str,
        budgets: Mapping[str, Budget] | None = None,
    ) -> None:
        """`settle`, logging instead of raising (a request's or job's, named by `what`): a
        reservation left unsettled holds budget until its period ends, erring on the side
        of the cap."""
        if cost_micros is not None and cost_micros > reservation.reserved_micros:
            log.warning(
                "budgets: %s cost %d micros, more than the %d it reserved",
                what,
                cost_micros,
                reservation.reserved_micros,
            )
        try:
            notified = await self.settle(
                reservation, tenant=tenant, cost_micros=cost_micros, budgets=budgets
            )
        except Exception:
            log.exception("budgets: could not settle the budget of %s", what)
            return
        for subject in notified:
            log.info("budgets: %s reached its budget's soft limit (%s)", subject, what)

    async def set_budget(self, subject: str, budget: Budget | None) -> None:
        """Set (None: remove) a subject's budget; spend so far this period still counts.
        Bumps the budgets' version (see budget_presence) in the same script."""
        raw = "" if budget is None else msgspec.json.encode(budget).decode()
        await self._set(keys=[keys.BUDGETS, keys.BUDGETS_VERSION], args=[subject, raw])

    async def budget(self, subject: str) -> Budget | None:
        raw = await self._redis.hget(keys.BUDGETS, subject)
        return None if raw is None else msgspec.json.decode(raw, type=Budget)

    async def all_budgets(self) -> dict[str, Budget]:
        """{subject: its budget} for every subject that has one."""
        raw = await self._redis.hgetall(keys.BUDGETS)
        return {reply_text(s): msgspec.json.decode(b, type=Budget) for s, b in raw.items()}

    async def budgets(self, subjects: list[str]) -> dict[str, Budget]:
        """{subject: its budget} for those of `subjects` that have one."""
        if not subjects:
            return {}
        raws = await self._redis.hmget(keys.BUDGETS, subjects)
        return {
            s: msgspec.json.decode(r, type=Budget)
            for s, r in zip(subjects, raws, strict=True)
            if r is not None
        }

    async def spend(self, subject: str, budget: Budget, *, now_s: float | None = None) -> Spend:
        """`subject`'s spend in the current period of `budget`."""
        now_s = time.time() if now_s is None else now_s
        key = keys.budget_spend(subject, period_label(budget.period, now_s))
        committed, spent = await self._redis.hmget(key, "committed", "spent")
        spent_micros = int(spent or 0)
        return Spend(
            spent_micros=spent_micros,
            reserved_micros=int(committed or 0) - spent_micros,
            period_start=iso(period_start(budget.period, now_s)),
            resets_at=iso(resets_at(budget.period, now_s)),
        )

    async def set_tenant_webhook(self, tenant: str, url: str | None) -> None:
        if url is None:
            await self._redis.hdel(keys.TENANT_WEBHOOKS, tenant)
        else:
            await self._redis.hset(keys.TENANT_WEBHOOKS, tenant, url)

    async def tenant_webhook(self, tenant: str) -> str | None:
        raw = await self._redis.hget(keys.TENANT_WEBHOOKS, tenant)
        return None if raw is None else reply_text(raw)


def soft_limit_body(subject: str, tenant: str, budget: Budget, at_s: float) -> str:
    """The budget.soft_limit_reached event of `subject`'s budget, for the period holding
    `at_s` (JSON; the settle script fills in data.spent_micros)."""
    kind, _, name = subject.partition(":")
    body = {
        "type": SOFT_LIMIT_EVENT,
        "timestamp": iso(dt.datetime.now(tz=dt.UTC)),
        "data": {
            "object": "budget",
            "tenant": tenant,
            "key_id": name if kind == "key" else None,
            "amount_micros": budget.amount_micros,
            "soft_limit": budget.soft_limit,
            "period": None if budget.period is Period.LIFETIME else str(budget.period),
            "period_start": iso(period_start(budget.period, at_s)),
            "resets_at": iso(resets_at(budget.period, at_s)),
            "spent_micros": 0,
        },
    }
    return msgspec.json.encode(body).decode()
