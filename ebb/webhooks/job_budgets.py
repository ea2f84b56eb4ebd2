"""A settled job's spend-cap reservation: replaced by what the job cost.

A job reserves its maximum cost against its caller's budgets when it is queued (at
submission, or when a parked job is queued), exactly as a synchronous request does, and
holds it while it waits and runs: a job the cap cannot cover is refused at submission
(429 insufficient_quota), never queued to fail later. When the job settles, one that never
ran (expired, cancelled while queued, failed before any claim) gives it all back; one that
ran keeps what its usage costs at its own prices (a Batch API job's discounted ones).
"""

from __future__ import annotations

from typing import Any

from ebb.billing.pricing import token_cost_micros
from ebb.queue.budgets import BudgetStore
from ebb.queue.job_schema import JobRecord


async def settle_job_budget(
    store: BudgetStore, record: JobRecord, *, ran: bool, usage: Any = None
) -> None:
    """Call once per job, when it settles; never raises."""
    reservation = record.budget_reservation
    if reservation is None:
        return
    cost: int | None = None
    if ran:
        counts = usage if isinstance(usage, dict) else {}
        # Without usage (it failed while running) the prompt was processed at least.
        prompt = int(counts.get("prompt_tokens", len(record.work.prompt_token_ids)))
        cost = token_cost_micros(
            prompt,
            int(counts.get("completion_tokens", 0)),
            record.work.price_per_1m_input_tokens_micros,
            record.work.price_per_1m_output_tokens_micros,
        )
    await store.settle_quietly(
        reservation, tenant=record.tenant, cost_micros=cost, what=f"job {record.job_id}"
    )
