"""Priority classes of async jobs (real redis-server): a job's attempts wait in its job
queue in the class its work carries, the first attempt and every one queued again
(retried, given back, continued after a lost runner, unparked), and the controller reads
the job queue's wait without the class's score offset."""

from __future__ import annotations

import msgspec
import pytest
import redis
from test_queue import runner_queue

from ebb.queue import keys
from ebb.queue.connection import async_client
from ebb.queue.job_schema import JobErrorInfo, JobRecord, attempt_request_id
from ebb.queue.job_store import JobStore
from ebb.queue.platform import PlatformState
from ebb.queue.schema import SamplingSpec, WorkItem

pytestmark = pytest.mark.integration

DEP = "prio-jobs"


def job(job_id: str, priority: str) -> JobRecord:
    item = WorkItem(
        request_id=attempt_request_id(job_id, 1),
        deployment=DEP,
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingSpec(max_tokens=4),
        job_id=job_id,
        priority=priority,
    )
    return JobRecord(
        job_id=job_id,
        tenant="acme",
        deployment=DEP,
        endpoint="completions",
        work=item,
        request_id=item.request_id,
        max_attempts=3,
    )


@pytest.fixture
async def stores(redis_url):
    client = async_client(redis_url)
    yield JobStore(client, retention_s=3600, result_ttl_s=60), PlatformState(client)
    await client.aclose()


async def submit(jobs: JobStore, record: JobRecord, *, parked: bool = False) -> None:
    await jobs.submit(
        record, ttl_s=3600, idempotency_digest="", submission_digest="x", parked=parked
    )


def claim_order(redis_url: str, runner: str = "r1") -> list[str]:
    rq = runner_queue(redis_url, runner)
    return [w.job_id for _ in range(8) for w in rq.claim(DEP, 1, max_jobs=1).claimed]


async def test_job_attempts_are_claimed_critical_then_standard_then_sheddable(redis_url, stores):
    jobs, _ = stores
    # Submitted least urgent first, so that arrival order alone would claim them backwards.
    for job_id, priority in [
        ("job_shed", "sheddable"),
        ("job_std", "standard"),
        ("job_crit", "critical"),
        ("job_crit2", "critical"),
    ]:
        await submit(jobs, job(job_id, priority))
    assert claim_order(redis_url) == ["job_crit", "job_crit2", "job_std", "job_shed"]


async def test_an_unparked_job_is_queued_in_its_class(redis_url, stores):
    jobs, _ = stores
    await submit(jobs, job("job_std", "standard"))
    parked = job("job_crit", "critical")
    await submit(jobs, parked, parked=True)
    assert await jobs.unpark(parked, parked.work)
    assert claim_order(redis_url) == ["job_crit", "job_std"]


async def test_a_retried_attempt_keeps_its_class(redis_url, stores):
    jobs, _ = stores
    await submit(jobs, job("job_crit", "critical"))
    [claimed] = runner_queue(redis_url, "r1").claim(DEP, 1, max_jobs=1).claimed
    await submit(jobs, job("job_std", "standard"))
    record = await jobs.get("job_crit")
    retry = msgspec.structs.replace(record.work, request_id=attempt_request_id("job_crit", 2))
    assert await jobs.requeue(record, retry, JobErrorInfo("runner_lost", "lost")) == 1
    assert claim_order(redis_url, "r2") == ["job_crit", "job_std"]


async def test_a_job_given_back_or_lost_goes_back_in_its_class(redis_url, stores):
    jobs, _ = stores
    await submit(jobs, job("job_crit", "critical"))
    rq = runner_queue(redis_url, "r1")
    [claimed] = rq.claim(DEP, 1, max_jobs=1).claimed
    r = redis.Redis.from_url(redis_url)
    # A standard job that has waited longest of all: only its class puts it after.
    await submit(jobs, job("job_std", "standard"))
    r.zadd(keys.job_queue(DEP), {attempt_request_id("job_std", 1): 1})
    assert rq.yield_job(DEP, claimed.request_id)
    assert claim_order(redis_url, "r2")[:1] == ["job_crit"]
    # Claimed again by r2 (its lease expires now): the reaper continues it in its class.
    r.zadd(keys.LEASES, {claimed.request_id: 0})
    await submit(jobs, job("job_std2", "standard"))
    r.zadd(keys.job_queue(DEP), {attempt_request_id("job_std2", 1): 1})
    reaper = PlatformState(async_client(redis_url), continuations=2)
    assert claimed.request_id in await reaper.reap_expired_leases()
    assert claim_order(redis_url, "r3")[:1] == ["job_crit"]


async def test_the_controller_reads_a_critical_jobs_wait_not_its_score(redis_url, stores):
    jobs, state = stores
    await submit(jobs, job("job_crit", "critical"))
    snapshot = await state.queue_snapshot(DEP)
    assert snapshot.job_depth == 1
    assert 0 <= snapshot.oldest_wait_s < 3600
