"""A busy runner's news of work against a real redis-server: after a claim that found both
queues empty, no claim is needed until a script announces work for it (an enqueue, a
job, a job given back, a cancel of what it holds, a request left for its prompt prefix),
the quiet bound passes, or its subscription is lost; a claim that leaves work queued, or
that began before the subscription was in place, never lets the next one be skipped."""

from __future__ import annotations

import uuid

import pytest
import redis
from support import wait_until
from test_job_queue import job, submit
from test_prefix_claiming import DEP as PREFIX_DEP
from test_prefix_claiming import SYSTEM
from test_prefix_claiming import runner as prefix_runner
from test_prefix_claiming import work as prefix_work
from test_queue import DEP, runner_queue, work

from ebb.queue import keys
from ebb.queue.connection import async_client
from ebb.queue.job_store import JobStore
from ebb.queue.requests import RequestQueue
from ebb.queue.runner_side import RunnerQueue
from ebb.queue.work_news import WorkNews

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def queues(redis_url):
    client = async_client(redis_url)
    yield (
        RequestQueue(client, request_ttl_s=60),
        JobStore(client, retention_s=3600, result_ttl_s=60),
    )
    await client.aclose()


def listening(rq: RunnerQueue, clock: Clock | None = None, deployment: str = DEP) -> WorkNews:
    news = rq.work_news(deployment, clock=clock) if clock else rq.work_news(deployment)
    news.start()
    wait_until(lambda: news.claim_begins() is not None, 5, "the subscription in place")
    return news


def caught_up(rq: RunnerQueue, news: WorkNews) -> None:
    """Until the listener heard every message published so far: Redis delivers a
    subscriber's messages in order, so until it heard one more on its own channel."""
    token = uuid.uuid4().hex.encode()
    rq._redis.publish(keys.runner_signal(rq.runner_id), token)
    wait_until(lambda: news._last_data == token, 5, "the listener to catch up")


def claim(rq: RunnerQueue, news: WorkNews, count: int = 1, deployment: str = DEP):
    """A claim, as the serving loop makes it, once the news of what came before it is in
    (as between two engine steps)."""
    caught_up(rq, news)
    began = news.claim_begins()
    result = rq.claim(deployment, count, max_jobs=count)
    news.claim_ended(began, queues_empty=result.queues_empty)
    return result


def announced(news: WorkNews, what: str) -> None:
    wait_until(news.claim_needed, 5, f"news of {what}")


async def test_an_enqueue_after_an_empty_claim_is_news(redis_url, queues):
    requests, _ = queues
    rq = runner_queue(redis_url, "r-news")
    news = listening(rq)
    try:
        assert news.claim_needed(), "no claim made yet"
        claim(rq, news)
        assert not news.claim_needed(), "both queues were empty"
        await requests.enqueue(work(1), admission_window_s=60, depth_limit=100)
        announced(news, "an enqueue")
        assert [w.request_id for w in claim(rq, news).claimed] == ["req-1"]
        assert not news.claim_needed()
    finally:
        news.stop()


async def test_a_claim_that_leaves_work_queued_is_followed_by_another(redis_url, queues):
    requests, jobs = queues
    rq = runner_queue(redis_url, "r-news")
    news = listening(rq)
    try:
        for i in range(2):
            await requests.enqueue(work(i), admission_window_s=60, depth_limit=100)
        claim(rq, news, count=1)
        assert news.claim_needed(), "a synchronous request still waits"
        claim(rq, news, count=1)
        await submit(jobs, job("job_news"))
        wait_until(news.claim_needed, 5, "news of a job")
        caught_up(rq, news)
        began = news.claim_begins()
        result = rq.claim(DEP, 1, max_jobs=0)  # no job slot now: the job stays queued
        assert result.jobs_waiting == 1
        news.claim_ended(began, queues_empty=result.queues_empty)
        assert news.claim_needed(), "a job waits for a slot"
        [attempt] = claim(rq, news).claimed
        assert attempt.job_id == "job_news" and not news.claim_needed()
        assert rq.yield_job(DEP, attempt.request_id)
        announced(news, "a job given back")
    finally:
        news.stop()


async def test_a_cancel_of_held_work_is_news_for_its_runner_only(redis_url, queues):
    requests, jobs = queues
    mine, other = runner_queue(redis_url, "r-mine"), runner_queue(redis_url, "r-other")
    news, others = listening(mine), listening(other)
    try:
        await requests.enqueue(work(1), admission_window_s=60, depth_limit=100)
        claim(mine, news)
        claim(other, others)
        assert not (news.claim_needed() or others.claim_needed())
        assert await requests.cancel(work(1)) == "aborting"
        announced(news, "a cancel")
        assert claim(mine, news).cancelled == ["req-1"]
        assert not others.claim_needed(), "another runner's cancel"
        await submit(jobs, job("job_c"))
        announced(news, "a job")
        [attempt] = claim(mine, news).claimed
        claim(other, others)
        assert await jobs.cancel("job_c") == "aborting"
        announced(news, "a job's cancel")
        assert claim(mine, news).cancelled == [attempt.request_id]
        assert not others.claim_needed()
    finally:
        news.stop()
        others.stop()


async def test_a_request_left_for_a_busy_runners_prefix_is_news_for_it(redis_url, queues):
    requests, _ = queues
    owner = prefix_runner(redis_url, "r-owner", affinity_ms=60_000)
    other = prefix_runner(redis_url, "r-other", affinity_ms=60_000)
    news = listening(owner, deployment=PREFIX_DEP)
    try:
        await requests.enqueue(prefix_work("a", SYSTEM + [1]), admission_window_s=60, depth_limit=9)
        assert [w.request_id for w in claim(owner, news, 4, PREFIX_DEP).claimed] == ["req-a"]
        assert not news.claim_needed()
        # Its queue signal announces the next one as well: what this test shows is that
        # the owner hears of it again when another runner's claim passes it over.
        await requests.enqueue(prefix_work("b", SYSTEM + [2]), admission_window_s=60, depth_limit=9)
        announced(news, "an enqueue")
        caught_up(owner, news)
        began = news.claim_begins()
        news.claim_ended(began, queues_empty=True)  # as if the owner had not claimed it yet
        assert not news.claim_needed()
        assert other.claim(PREFIX_DEP, 4).claimed == [], "left for the owner"
        announced(news, "a request left for its prefix")
        assert [w.request_id for w in claim(owner, news, 4, PREFIX_DEP).claimed] == ["req-b"]
    finally:
        news.stop()


async def test_the_quiet_bound_and_a_lost_subscription_each_call_for_a_claim(redis_url):
    rq = runner_queue(redis_url, "r-news")
    clock = Clock()
    news = listening(rq, clock)
    try:
        claim(rq, news)
        clock.now += 0.25
        assert not news.claim_needed()
        clock.now += 0.25
        assert news.claim_needed(), "half a second since the last claim"
        claim(rq, news)
        assert not news.claim_needed()
        killed = redis.Redis.from_url(redis_url).client_kill_filter(_type="pubsub")
        assert killed >= 1
        announced(news, "a lost subscription")
        # It subscribes again; a claim begun before it had would not count as quiet.
        wait_until(lambda: news.claim_begins() is not None, 5, "subscribed again")
        claim(rq, news)
        assert not news.claim_needed()
    finally:
        news.stop()
    assert news.claim_needed(), "a stopped listener hears nothing"


def test_a_claim_begun_before_the_subscription_never_counts_as_quiet(redis_url):
    rq = runner_queue(redis_url, "r-news")
    news = rq.work_news(DEP)
    assert news.claim_begins() is None, "not started"
    news.claim_ended(news.claim_begins(), queues_empty=True)
    assert news.claim_needed()
