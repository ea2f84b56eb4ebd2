"""Jobs in the queue on a real redis-server: claims that prefer synchronous requests, lost
runners and attempts, TTL expiry, cancel between attempts, announcements, delivery leases
and signatures across a secret rotation (collector and delivery worker driven directly)."""

from __future__ import annotations

import asyncio
import threading

import httpx
import msgspec
import pytest
import redis
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError
from support import wait_until
from support.webhook_receiver import Receiver
from test_queue import runner_queue, work

from ebb.config import Settings
from ebb.queue import keys
from ebb.queue.connection import async_client
from ebb.queue.delivery_store import DeliveryStore
from ebb.queue.job_moves import JobMoves
from ebb.queue.job_schema import (
    DeliveryAttempt,
    JobEvent,
    JobRecord,
    JobStatus,
    attempt_request_id,
)
from ebb.queue.job_store import JobStore
from ebb.queue.platform import PlatformState
from ebb.queue.requests import RequestQueue
from ebb.queue.schema import (
    ChoiceDelta,
    Claimed,
    Continued,
    Finished,
    Progress,
    SamplingSpec,
    WorkItem,
    decode_event,
)
from ebb.queue.webhook_secrets import WebhookSecrets
from ebb.webhooks.collector import JobCollector
from ebb.webhooks.sender import Deliverer
from ebb.webhooks.signing import new_secret

pytestmark = pytest.mark.integration

DEP = "dep-a"


def settings(url: str, **overrides) -> Settings:
    return Settings(
        redis_url=url,
        webhook_allowed_cidrs="127.0.0.0/8",
        webhook_retry_base_s=0.05,
        webhook_retry_max_delay_s=0.1,
        **overrides,
    )


def job(job_id: str, *, url: str = "", max_attempts: int = 3) -> JobRecord:
    item = WorkItem(
        request_id=attempt_request_id(job_id, 1),
        deployment=DEP,
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingSpec(max_tokens=4),
        job_id=job_id,
    )
    return JobRecord(
        job_id=job_id,
        tenant="acme",
        deployment=DEP,
        endpoint="completions",
        work=item,
        request_id=item.request_id,
        max_attempts=max_attempts,
        webhook_url=url,
        webhook_events=list(JobEvent) if url else [],
    )


@pytest.fixture
async def stores(redis_url):
    client = async_client(redis_url)
    yield JobStore(client, retention_s=3600, result_ttl_s=60), PlatformState(client)
    await client.aclose()


async def submit(jobs: JobStore, record: JobRecord, ttl_s: int = 3600) -> None:
    await jobs.submit(record, ttl_s=ttl_s, idempotency_digest="", submission_digest="x")


def run_to_end(rq, request_id: str, tokens: int = 4) -> None:
    """What a runner does with a claimed attempt: output, then finish once."""
    claimed = [w for w in rq.claim(DEP, 1, max_jobs=1).claimed if w.request_id == request_id]
    assert claimed, f"{request_id} was not claimable"
    delta = ChoiceDelta(index=0, text="Paris", token_count=tokens, finish_reason="length")
    rq.publish({request_id: Progress(choices=[delta])})
    assert rq.finish(
        claimed[0],
        state="finished",
        event=Finished(3, tokens),
        prompt_tokens=3,
        completion_tokens=tokens,
    )


async def test_jobs_take_only_the_slots_synchronous_requests_leave(redis_url, stores):
    jobs, _ = stores
    for i in range(3):
        await submit(jobs, job(f"job_{i}"))
    client = async_client(redis_url)
    sync = RequestQueue(client, request_ttl_s=60)
    for i in range(2):
        await sync.enqueue(work(i), admission_window_s=60, depth_limit=10)
    rq = runner_queue(redis_url, "r1")
    first = rq.claim(DEP, 2, max_jobs=2).claimed
    assert [w.request_id for w in first] == ["req-0", "req-1"], "synchronous requests first"
    assert rq.claim(DEP, 4, max_jobs=0).claimed == [], "no job beyond the job slots"
    capped = rq.claim(DEP, 4, max_jobs=1).claimed
    assert [w.job_id for w in capped] == ["job_0"]
    await sync.enqueue(work(9), admission_window_s=60, depth_limit=10)
    mixed = rq.claim(DEP, 4, max_jobs=4).claimed
    assert [w.request_id for w in mixed] == ["req-9", "job_1.1", "job_2.1"]
    assert await jobs.watched() == ["job_0", "job_1", "job_2"]
    await client.aclose()


async def test_a_claim_says_how_many_synchronous_requests_it_left_queued(redis_url):
    client = async_client(redis_url)
    sync = RequestQueue(client, request_ttl_s=60)
    for i in range(3):
        await sync.enqueue(work(i), admission_window_s=60, depth_limit=10)
    rq = runner_queue(redis_url, "r1")
    assert rq.claim(DEP, 0).sync_waiting == 3, "a full runner learns that 3 wait"
    assert rq.claim(DEP, 2).sync_waiting == 1
    assert rq.claim(DEP, 2).sync_waiting == 0
    await client.aclose()


async def test_a_job_given_back_keeps_its_output_and_is_continued_in_its_place(redis_url, stores):
    jobs, state = stores
    for i in range(2):
        await submit(jobs, job(f"job_{i}"), ttl_s=1)
    rq = runner_queue(redis_url, "r1")
    [first] = rq.claim(DEP, 1, max_jobs=1).claimed
    rq.publish(
        {first.request_id: Progress(choices=[ChoiceDelta(index=0, text="Par", token_count=2)])}
    )
    assert not runner_queue(redis_url, "r2").yield_job(DEP, first.request_id), "not r2's"
    assert rq.yield_job(DEP, first.request_id)
    assert not rq.yield_job(DEP, first.request_id), "given back once"
    r = redis.Redis.from_url(redis_url)
    assert r.zrange(keys.LEASES, 0, -1) == [], "no lease left to reap"
    kept = [decode_event(f[b"e"]) for _, f in r.xrange(keys.events(first.request_id))]
    assert [type(e) for e in kept] == [Claimed, Progress, Continued], "its output is kept"
    assert await state.usage_records() == [], "nothing billed for the run given back"
    # Its TTL (1 s) counted until it started, so it no longer expires; the job that
    # never started does.
    await asyncio.sleep(1.1)
    collector = JobCollector(jobs, settings(redis_url))
    await collector.pass_once()
    assert (await jobs.get("job_1")).status is JobStatus.EXPIRED
    assert (await jobs.get("job_0")).status is not JobStatus.EXPIRED
    # The next claim continues it: only the rest of the output follows.
    result = rq.claim(DEP, 1, max_jobs=1)
    assert [w.request_id for w in result.claimed] == [first.request_id]
    assert result.continued == {first.request_id}
    rest = ChoiceDelta(index=0, text="is", token_count=2, finish_reason="length")
    rq.publish({first.request_id: Progress(choices=[rest], seq=1, attempt=1)})
    assert rq.finish(
        first, state="finished", event=Finished(3, 4), prompt_tokens=3, completion_tokens=4
    )
    await collector.pass_once()
    record = await jobs.get("job_0")
    assert record.status is JobStatus.SUCCEEDED
    assert record.result["choices"][0]["text"] == "Paris", "the output of both runs, once"
    assert [u.request_id for u in await state.usage_records()] == ["job_0.1"]


async def test_a_job_being_cancelled_is_not_given_back(redis_url, stores):
    jobs, _ = stores
    await submit(jobs, job("job_c"))
    rq = runner_queue(redis_url, "r1")
    [claimed] = rq.claim(DEP, 1, max_jobs=1).claimed
    assert await jobs.cancel("job_c") == "aborting"
    assert not rq.yield_job(DEP, claimed.request_id), "the cancel wins: the runner aborts it"
    assert rq.claim(DEP, 1).cancelled == [claimed.request_id]


async def test_a_lost_attempt_is_retried_then_the_job_fails(redis_url, stores):
    jobs, state = stores
    await submit(jobs, job("job_lost", max_attempts=2))
    collector = JobCollector(jobs, settings(redis_url))
    r = redis.Redis.from_url(redis_url)
    for attempt in (1, 2):
        rq = runner_queue(redis_url, f"r{attempt}", lease_ttl_s=0.05)
        [claimed] = rq.claim(DEP, 1, max_jobs=1).claimed
        assert claimed.request_id == f"job_lost.{attempt}"
        wait_until(lambda: r.zrangebyscore(keys.LEASES, "-inf", _now_ms(r)), 5, "lease expiry")
        assert await state.reap_expired_leases() == [claimed.request_id]
        await collector.pass_once()
        record = await jobs.get("job_lost")
        if attempt == 1:
            assert record.status is JobStatus.QUEUED and record.attempt == 2
            assert record.last_error.code == "runner_lost"
            # The lost runner finishing late changes nothing and bills nothing.
            late = rq.finish(
                claimed,
                state="finished",
                event=Finished(3, 4),
                prompt_tokens=3,
                completion_tokens=4,
            )
            assert not late
    assert record.status is JobStatus.FAILED and record.attempt == 2
    assert record.error.code == "runner_lost" and "failed 2 times" in record.error.message
    assert r.xlen(keys.USAGE) == 0
    assert await jobs.watched() == [], "a settled job without a webhook is not watched"
    assert r.zcard(keys.job_queue(DEP)) == 0


async def test_a_job_not_started_within_its_ttl_expires(redis_url, stores):
    jobs, _ = stores
    await submit(jobs, job("job_late"), ttl_s=1)
    await submit(jobs, job("job_claimed_late"), ttl_s=1)
    r = redis.Redis.from_url(redis_url)
    deadline_ms = int(r.hget(keys.job("job_late"), "expires_ms"))
    wait_until(lambda: _now_ms(r) > deadline_ms + 5, 5, "the TTL to pass")
    # A runner reaching a job past its deadline marks it expired instead of running it.
    assert runner_queue(redis_url, "r1").claim(DEP, 1, max_jobs=1).claimed == []
    await JobCollector(jobs, settings(redis_url)).pass_once()
    for job_id in ("job_late", "job_claimed_late"):
        record = await jobs.get(job_id)
        assert record.status is JobStatus.EXPIRED and record.error.code == "expired"
    assert r.zcard(keys.job_queue(DEP)) == 0 and r.zcard(keys.JOBS_WAITING) == 0


async def test_cancel_between_attempts_settles_instead_of_retrying(redis_url, stores):
    jobs, state = stores
    await submit(jobs, job("job_c"))
    r = redis.Redis.from_url(redis_url)
    rq = runner_queue(redis_url, "r1", lease_ttl_s=0.05)
    rq.claim(DEP, 1, max_jobs=1)
    wait_until(lambda: r.zrangebyscore(keys.LEASES, "-inf", _now_ms(r)), 5, "lease expiry")
    await state.reap_expired_leases()
    assert await jobs.cancel("job_c") == "pending"
    await JobCollector(jobs, settings(redis_url)).pass_once()
    record = await jobs.get("job_c")
    assert record.status is JobStatus.CANCELLED and record.attempt == 1
    assert r.zcard(keys.job_queue(DEP)) == 0
    assert await jobs.cancel("job_c") == "cancelled"


async def test_each_event_is_announced_once(redis_url, stores):
    jobs, _ = stores
    await submit(jobs, job("job_w", url="http://127.0.0.1:9/hook"))
    collector = JobCollector(jobs, settings(redis_url))
    rq = runner_queue(redis_url, "r1")
    run_to_end(rq, "job_w.1")
    for _ in range(3):
        await collector.pass_once()
    record = await jobs.get("job_w")
    assert record.status is JobStatus.SUCCEEDED
    assert record.result["choices"][0]["text"] == "Paris"
    assert record.usage == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    r = redis.Redis.from_url(redis_url)
    webhook_ids = [w.decode() for w in r.lrange(keys.job_deliveries("job_w"), 0, -1)]
    events = [r.hget(keys.delivery(w), "event").decode() for w in webhook_ids]
    assert events == ["job.started", "job.succeeded"]
    assert r.zcard(keys.DELIVERIES_DUE) == 2
    assert await jobs.watched() == []


async def test_a_leased_delivery_belongs_to_its_worker_until_the_lease_ends(redis_url, stores):
    jobs, _ = stores
    await submit(jobs, job("job_l", url="http://127.0.0.1:9/hook"))
    run_to_end(runner_queue(redis_url, "r1"), "job_l.1")
    await JobCollector(jobs, settings(redis_url)).pass_once()
    store = DeliveryStore(jobs.redis, record_ttl_s=600)
    taken = await store.claim_due(10, lease_ms=300, owner="a")
    assert len(taken) == 2
    assert await store.claim_due(10, lease_ms=300, owner="b") == [], "leased to a"
    failed = DeliveryAttempt(at_ms=1, latency_ms=1.0, status_code=503, error="HTTP 503")
    # b's late attempt is recorded but does not move a's schedule.
    assert not await store.record(taken[0].webhook_id, owner="b", attempt=failed, outcome="failed")
    assert await store.record(
        taken[0].webhook_id, owner="a", attempt=failed, outcome="retry", next_ms=1
    )
    again = await store.claim_due(10, lease_ms=60_000, owner="b")
    assert [d.webhook_id for d in again] == [taken[0].webhook_id]
    assert again[0].attempts == 2
    r = redis.Redis.from_url(redis_url)
    wait_until(lambda: r.zrangebyscore(keys.DELIVERIES_DUE, "-inf", _now_ms(r)), 5, "lease end")
    reclaimed = await store.claim_due(10, lease_ms=300, owner="b")
    assert [d.webhook_id for d in reclaimed] == [taken[1].webhook_id], "a's lease ran out"


async def test_signatures_cover_the_rotation_overlap(redis_url, stores, receiver):
    jobs, _ = stores
    secrets = WebhookSecrets(jobs.redis)
    old = (await secrets.ensure("acme", new_secret())).current
    new = (await secrets.rotate("acme", new_secret(), overlap_s=600)).current
    config = settings(redis_url)
    collector = JobCollector(jobs, config)
    async with httpx.AsyncClient() as http:
        deliverer = Deliverer(DeliveryStore(jobs.redis, record_ttl_s=600), secrets, config, http)

        async def run_and_deliver(job_id: str) -> list:
            await submit(jobs, job(job_id, url=receiver.url))
            run_to_end(runner_queue(redis_url, "r1"), f"{job_id}.1")
            await collector.pass_once()
            await deliverer.dispatch_due()
            await deliverer.drain(grace_s=10)
            return receiver.accepted(job_id)

        during = await run_and_deliver("job_s1")
        assert len(during) == 2
        for delivery in during:
            assert len(delivery.headers["webhook-signature"].split()) == 2
            for secret in (old, new):
                Webhook(secret).verify(delivery.body, delivery.headers)

        newest = (await secrets.rotate("acme", new_secret(), overlap_s=0)).current
        after = await run_and_deliver("job_s2")
        assert len(after) == 2
        for delivery in after:
            Webhook(newest).verify(delivery.body, delivery.headers)
            with pytest.raises(WebhookVerificationError):
                Webhook(new).verify(delivery.body, delivery.headers)


def _now_ms(r: redis.Redis) -> int:
    now_s, now_us = r.time()
    return now_s * 1000 + now_us // 1000


async def test_an_endpoint_gets_at_most_its_concurrency(redis_url, stores):
    jobs, _ = stores
    gate = threading.Event()
    receiver = Receiver(answer_after=gate).start()
    config = settings(redis_url, webhook_endpoint_concurrency=2)
    collector = JobCollector(jobs, config)
    rq = runner_queue(redis_url, "r1")
    for i in range(5):  # 10 deliveries: job.started and job.succeeded each
        await submit(jobs, job(f"job_e{i}", url=receiver.url))
        run_to_end(rq, f"job_e{i}.1")
    await collector.pass_once()
    r = redis.Redis.from_url(redis_url)
    async with httpx.AsyncClient() as http:
        deliverer = Deliverer(
            DeliveryStore(jobs.redis, record_ttl_s=600), WebhookSecrets(jobs.redis), config, http
        )
        try:
            assert await deliverer.dispatch_due() == 8, "4 per endpoint slot at most"
            leased = r.zrange(keys.DELIVERIES_DUE, 0, -1, withscores=True)
            deferred = [s for _, s in leased if s < _now_ms(r) + 5_000]
            assert len(deferred) == 2, "the rest waits in Redis, due again in a second"
            for _ in range(1000):  # the attempts run on this event loop: yield to them
                if receiver.in_flight == 2:
                    break
                await asyncio.sleep(0.01)
            assert receiver.in_flight == 2
            gate.set()
            await deliverer.drain(grace_s=20)
        finally:
            gate.set()
            receiver.stop()
    assert receiver.most_in_flight == 2


async def test_a_job_that_cannot_be_collected_fails_alone(redis_url, stores):
    jobs, _ = stores
    for job_id in ("job_bad", "job_good"):
        await submit(jobs, job(job_id))
    rq = runner_queue(redis_url, "r1")
    redis.Redis.from_url(redis_url).xadd(keys.events("job_bad.1"), {"e": b"not an event"})
    run_to_end(rq, "job_bad.1")
    run_to_end(rq, "job_good.1")
    collector = JobCollector(jobs, settings(redis_url))
    await collector.pass_once()
    bad, good = await jobs.get("job_bad"), await jobs.get("job_good")
    assert bad.status is JobStatus.FAILED and bad.error.code == "internal"
    assert good.status is JobStatus.SUCCEEDED
    await collector.pass_once()
    assert await jobs.watched() == [], "the failed job is announced and let go"


async def test_a_versions_jobs_wait_in_its_own_queue_and_move_when_it_retires(redis_url, stores):
    jobs, _ = stores
    v2 = f"{DEP}@v2"
    first = job("job_v2")
    await submit(
        jobs,
        msgspec.structs.replace(first, work=msgspec.structs.replace(first.work, deployment=v2)),
    )
    r = redis.Redis.from_url(redis_url)
    assert (r.zcard(keys.job_queue(v2)), r.zcard(keys.job_queue(DEP))) == (1, 0)
    for i in range(3):
        await submit(jobs, job(f"job_m{i}"))
    [ran] = runner_queue(redis_url, "r1").claim(DEP, 1, max_jobs=1).claimed
    assert ran.job_id == "job_m0"
    # Version 1 retires: what still waits moves, in order; what a runner holds stays.
    assert await JobMoves(jobs.redis).move_queued(DEP, v2) == 2
    assert r.zcard(keys.job_queue(DEP)) == 0
    assert await jobs.cancel("job_m2") == "withdrawn", "a moved job is cancelled where it is"
    claimed = runner_queue(redis_url, "r2").claim(v2, 4, max_jobs=4).claimed
    assert [(w.job_id, w.deployment) for w in claimed] == [("job_v2", v2), ("job_m1", v2)]
    r.close()
