"""Continuation by token replay, the queue's part, against a real redis-server: the reaper
queues a lost runner's request again as a continuation (a bounded number of times), the
next claim knows it, and every reader keeps the same output (late writes of the lost
runner dropped)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import redis
from support import wait_until
from test_job_queue import job, submit
from test_queue import runner_queue, work

from ebb.config import Settings
from ebb.frontdoor import execution
from ebb.frontdoor.execution import Executor
from ebb.queue import keys
from ebb.queue.connection import async_client
from ebb.queue.job_store import JobStore
from ebb.queue.platform import PlatformState
from ebb.queue.requests import RequestQueue
from ebb.queue.schema import (
    ChoiceDelta,
    Claimed,
    Continued,
    DeploymentSpec,
    Failed,
    Progress,
    SamplingSpec,
)

pytestmark = pytest.mark.integration

DEP = "dep-a"


def delta(text: str, *, finish: str | None = None) -> ChoiceDelta:
    ids = list(text.encode())
    return ChoiceDelta(
        index=0, text=text, token_count=len(ids), token_ids=ids, finish_reason=finish
    )


async def _reap_until(state: PlatformState, request_id: str) -> None:
    """Reap until `request_id`'s lease expired and was reaped."""
    reaped: list[str] = []

    async def reap() -> None:
        while request_id not in reaped:
            reaped.extend(await state.reap_expired_leases())
            await asyncio.sleep(0.05)

    await asyncio.wait_for(reap(), 10)


async def test_a_lost_runners_request_is_continued_a_bounded_number_of_times(redis_url):
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    state = PlatformState(client, continuations=1, continuation_window_s=10)
    item = work("cont")
    await queue.enqueue(item, admission_window_s=10, depth_limit=10)
    first = runner_queue(redis_url, "r-first", lease_ttl_s=0.05)
    assert first.claim(DEP, 1).continued == frozenset()
    first.publish({item.request_id: Progress(choices=[delta("Pa")], seq=1)})
    await _reap_until(state, item.request_id)
    # Continued, not failed: the next claim knows it, and replays what was delivered.
    second = runner_queue(redis_url, "r-second", lease_ttl_s=0.05)
    claim = second.claim(DEP, 1)
    assert [w.request_id for w in claim.claimed] == [item.request_id]
    assert claim.continued == {item.request_id}
    so_far = second.output_so_far(item.request_id)
    assert (so_far.token_ids, so_far.completion_tokens, so_far.attempt) == (list(b"Pa"), 2, 1)
    # The lost runner writes late: nobody keeps it (not the continuation, not a reader).
    first.publish({item.request_id: Progress(choices=[delta("XX")], seq=2)})
    second.publish({item.request_id: Progress(choices=[delta("ri")], seq=1, attempt=1)})
    assert second.output_so_far(item.request_id).token_ids == list(b"Pari")
    reader = queue.events(item.request_id)
    seen = [await reader.next(1) for _ in range(6)]
    assert [type(e) for e in seen] == [Claimed, Progress, Continued, Claimed, Progress, type(None)]
    texts = [e.choices[0].text for e in seen if isinstance(e, Progress)]
    assert texts == ["Pa", "ri"], "nothing repeated, nothing of the lost runner's late writes"
    # Past the bound, the loss is its answer.
    await _reap_until(state, item.request_id)
    assert isinstance(await reader.next(1), Failed)
    fields = redis.Redis.from_url(redis_url).hgetall(keys.request(item.request_id))
    assert fields[b"state"] == b"failed" and fields[b"continuations"] == b"1"
    await client.aclose()


async def test_a_dead_runners_leases_expire_at_once(redis_url):
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    state = PlatformState(client, continuations=3, continuation_window_s=10)
    items = [work(f"dead-{i}") for i in range(2)]
    for item in items:
        await queue.enqueue(item, admission_window_s=10, depth_limit=10)
    dead = runner_queue(redis_url, "r-dead", lease_ttl_s=3600)
    [lost] = dead.claim(DEP, 1).claimed
    alive = runner_queue(redis_url, "r-alive", lease_ttl_s=3600)
    assert len(alive.claim(DEP, 1).claimed) == 1
    await state.mark_runner_gone("r-dead", state="failed")
    # Leases of an hour, yet the dead runner's request is continued at the next reap, and
    # only that one.
    assert await state.reap_expired_leases() == [lost.request_id]
    holder = redis.Redis.from_url(redis_url).hget(keys.request(lost.request_id), "runner")
    assert holder is None, "queued again, nobody's yet"
    taken = wait_until(lambda: alive.claim(DEP, 1), 5, "the survivor to claim it")
    assert taken.continued == {lost.request_id}
    await client.aclose()


async def test_a_continuation_no_runner_claims_in_time_ends_with_the_honest_error(
    redis_url, monkeypatch
):
    monkeypatch.setattr(execution, "_EVENT_SILENCE_S", 0.3)
    client = async_client(redis_url)
    state = PlatformState(client, continuations=3, continuation_window_s=0.5)
    executor = Executor(
        Settings(redis_url=redis_url), RequestQueue(client, request_ttl_s=60), state
    )
    item = work("orphan")
    rq = runner_queue(redis_url, "r-only", lease_ttl_s=0.05)
    admitting = asyncio.ensure_future(executor.admit(item, DeploymentSpec(name=DEP, source="x")))
    await asyncio.to_thread(wait_until, lambda: rq.claim(DEP, 1).claimed, 5, "the claim")
    running = await admitting
    rq.publish({item.request_id: Progress(choices=[delta("Pa")], seq=1)})
    events = executor.events(running)
    first = await anext(events)
    assert isinstance(first, Progress)
    await _reap_until(state, item.request_id)  # continued, but no runner is left
    last = await asyncio.wait_for(anext(events), 10)
    assert isinstance(last, Failed) and last.code == "runner_lost"
    assert "in time" in last.message
    fields = redis.Redis.from_url(redis_url).hgetall(keys.request(item.request_id))
    assert fields[b"state"] == b"withdrawn", "it never runs after the client was told"
    await client.aclose()


async def test_a_lost_job_attempt_keeps_its_output_and_is_continued_in_its_queue(redis_url):
    client = async_client(redis_url)
    jobs = JobStore(client, retention_s=3600, result_ttl_s=60)
    state = PlatformState(client, continuations=3, continuation_window_s=10)
    await submit(jobs, job("job_lost"))
    lost = runner_queue(redis_url, "r-lost", lease_ttl_s=0.05)
    [attempt] = lost.claim(DEP, 1, max_jobs=1).claimed
    lost.publish({attempt.request_id: Progress(choices=[delta("Pa")], seq=1)})
    await _reap_until(state, attempt.request_id)
    r = redis.Redis.from_url(redis_url)
    assert r.zrange(keys.job_queue(DEP), 0, -1) == [attempt.request_id.encode()]
    assert r.zcard(keys.queue(DEP)) == 0, "not among the synchronous requests"
    nxt = runner_queue(redis_url, "r-next")
    taken = nxt.claim(DEP, 1, max_jobs=1)
    assert taken.continued == {attempt.request_id}, "the same attempt, continued"
    assert nxt.output_so_far(attempt.request_id).token_ids == list(b"Pa")
    await client.aclose()


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingSpec(max_tokens=4, n=2),
        SamplingSpec(max_tokens=4, json_object=True),
        SamplingSpec(max_tokens=4, json_schema={"type": "object"}),
    ],
    ids=["two-choices", "json-object", "json-schema"],
)
async def test_output_no_continuation_can_go_on_with_ends_with_runner_lost(redis_url, sampling):
    client = async_client(redis_url)
    queue = RequestQueue(client, request_ttl_s=60)
    state = PlatformState(client, continuations=3, continuation_window_s=10)
    item = msgspec.structs.replace(work(f"guided-{sampling.n}"), sampling=sampling)
    await queue.enqueue(item, admission_window_s=10, depth_limit=10)
    runner_queue(redis_url, "r-lost", lease_ttl_s=0.05).claim(DEP, 1)
    await _reap_until(state, item.request_id)
    reader = queue.events(item.request_id)
    seen = [await reader.next(1) for _ in range(2)]
    assert isinstance(seen[-1], Failed) and seen[-1].code == "runner_lost"
    await client.aclose()
