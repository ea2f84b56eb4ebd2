"""A settled job's rate-limit reservation: give back what the job did not use.

A job reserves against its caller's limits at submission like a synchronous request (one
request, prompt + max_tokens x n tokens). When it settles, a job that never ran gets all of
it back; one that ran keeps the tokens it used (its usage) and its request.
"""

from __future__ import annotations

import logging

from ebb.queue.job_schema import JobRecord
from ebb.queue.ratelimits import RateLimitStore

log = logging.getLogger(__name__)


async def give_back_unused(
    store: RateLimitStore, record: JobRecord, *, ran: bool, used_tokens: int = 0
) -> None:
    """Call once per job, when it settles; never raises (a bucket refills within a minute)."""
    reserved = record.rate_reserved_tokens
    if not reserved:
        return
    requests, tokens = (0, reserved - used_tokens) if ran else (1, reserved)
    if not (requests or tokens):
        return
    try:
        await store.adjust(record.work.key_id, record.tenant, requests=requests, tokens=tokens)
    except Exception:
        log.exception("jobs: could not settle the rate limits of %s", record.job_id)
