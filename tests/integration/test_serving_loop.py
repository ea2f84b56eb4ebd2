"""A runner's serving loop (fake engine, real Redis, burst mode, in-process) as the
frontdoor sees it: events, usage, leases, cancellation, job slots and drain rules."""

from __future__ import annotations

import asyncio
import fcntl
import functools
import os
import threading
import time

import pytest
from support import wait_until
from support.serving_harness import DEP, FAKE_REPLY, serving_harness, text_of

from ebb.config import Settings
from ebb.queue import keys
from ebb.queue.job_schema import JobStatus
from ebb.queue.schema import Claimed, Failed, Finished, Progress, RunnerState
from ebb.runners.core_pinning import LOCK_FILE, own_core
from ebb.runners.serve import Outcome, job_claims_per_step, job_slots
from ebb.webhooks.collector import JobCollector

pytestmark = pytest.mark.integration

# Five milliseconds a token: a 1500-token request runs for seconds, long enough to act on
# while it runs and far from finishing on its own.
SLOW = "fake://m?step_ms=5"


def deltas(events) -> list:
    return [c for e in events if isinstance(e, Progress) for c in e.choices]


async def reap_until(h, done, *, into: list[str] | None = None, timeout_s=10) -> list[str]:
    """Run the lease reaper as the controller does (a pass every 20 ms) until `done()`;
    returns what it reaped."""
    reaped = [] if into is None else into
    async with asyncio.timeout(timeout_s):
        while not done():
            reaped += await h.platform.reap_expired_leases()
            await asyncio.sleep(0.02)
    return reaped


# --- output, finish once, usage ----------------------------------------------------------


async def test_a_request_streams_its_reply_then_finishes_once_with_its_usage(redis_url):
    async with serving_harness(redis_url) as h:
        work = await h.submit(
            12,
            tenant="acme",
            key_id="ebb-sk-k1",
            price_per_1m_input_tokens_micros=5,
            price_per_1m_output_tokens_micros=7,
        )
        assert await h.serve() is Outcome.IDLE
        events = await h.events(work.request_id)
        assert events[0] == Claimed(runner_id="r-h")
        assert text_of(events) == FAKE_REPLY[:12]
        assert deltas(events)[-1].finish_reason == "length"
        assert events[-1] == Finished(prompt_tokens=3, completion_tokens=12)
        assert h.all_events(work.request_id) == events, "exactly one terminal event"
        state = await h.state(work.request_id)
        assert (state["state"], state["completion_tokens"]) == ("finished", "12")
        [usage] = await h.usage()
        assert (usage.request_id, usage.state, usage.runner_id, usage.deployment) == (
            work.request_id,
            "finished",
            "r-h",
            DEP,
        )
        assert (usage.prompt_tokens, usage.completion_tokens) == (3, 12)
        assert (usage.tenant, usage.key_id) == ("acme", "ebb-sk-k1")
        prices = (usage.price_per_1m_input_tokens_micros, usage.price_per_1m_output_tokens_micros)
        assert prices == (5, 7), "the prices in force at admission"
        assert h.leases() == [], "the lease ends with the request"
        assert h.first_outputs == [work], "the first token is reported once"
        assert h.runner_state() is RunnerState.READY


async def test_queued_requests_share_one_batch_and_each_ends_on_its_own(redis_url):
    async with serving_harness(redis_url, max_concurrency=4) as h:
        works = [await h.submit(n) for n in (2, 5, 9)]
        assert await h.serve() is Outcome.IDLE
        assert h.engine.batches[0] == {w.request_id for w in works}
        for work, n in zip(works, (2, 5, 9), strict=True):
            events = await h.events(work.request_id)
            assert text_of(events) == FAKE_REPLY[:n]
            assert events[-1] == Finished(3, n)
        usage = {u.request_id: u.completion_tokens for u in await h.usage()}
        assert usage == {w.request_id: n for w, n in zip(works, (2, 5, 9), strict=True)}


async def test_n_choices_and_stop_sequences(redis_url):
    async with serving_harness(redis_url) as h:
        two = await h.submit(5, n=2)
        stopped = await h.submit(100, stop=["Paris"])
        assert await h.serve() is Outcome.IDLE

        events = await h.events(two.request_id)
        assert text_of(events, 0) == text_of(events, 1) == FAKE_REPLY[:5]
        assert sorted(d.index for d in deltas(events) if d.finish_reason == "length") == [0, 1]
        assert events[-1] == Finished(3, 10), "completion tokens count every choice"

        events = await h.events(stopped.request_id)
        said = text_of(events)
        assert "Paris" not in said and FAKE_REPLY.startswith(said)
        assert deltas(events)[-1].finish_reason == "stop"
        assert isinstance(events[-1], Finished) and events[-1].completion_tokens < 100
        usage = {u.request_id: u.completion_tokens for u in await h.usage()}
        assert usage == {two.request_id: 10, stopped.request_id: events[-1].completion_tokens}


async def test_a_request_the_engine_refuses_fails_alone(redis_url):
    async with serving_harness(redis_url) as h:
        bad, good = await h.submit(0), await h.submit(3)
        assert await h.serve() is Outcome.IDLE
        failed = (await h.events(bad.request_id))[-1]
        assert isinstance(failed, Failed) and failed.code == "invalid_request"
        assert "max_tokens" in failed.message
        assert (await h.events(good.request_id))[-1] == Finished(3, 3)
        usage = {u.request_id: (u.state, u.completion_tokens) for u in await h.usage()}
        assert usage == {bad.request_id: ("failed", 0), good.request_id: ("finished", 3)}


async def test_a_broken_engine_ends_every_held_request_with_an_error(redis_url):
    """What the runner process does when the loop raises: none of its requests hangs."""
    async with serving_harness(redis_url, max_concurrency=4) as h:
        works = [await h.submit(50) for _ in range(2)]
        h.engine.breaks_at_step = 3
        with pytest.raises(RuntimeError, match="illegal memory access"):
            await h.serve()
        h.loop.fail_all("the engine failed")
        for work in works:
            ended = (await h.events(work.request_id))[-1]
            assert (ended.code, ended.retryable) == ("engine_error", True)
        usage = [(u.state, u.completion_tokens) for u in await h.usage()]
        assert usage == [("failed", 3)] * 2, "billed for what was generated before"
        assert h.leases() == []


# --- cancellation --------------------------------------------------------------------------


async def test_cancel_aborts_the_running_request_in_the_engine(redis_url):
    """What the frontdoor does when a streaming client disconnects: the runner aborts the
    request in its engine (freeing its KV cache) and bills what was generated."""
    async with serving_harness(redis_url, source=SLOW) as h:
        work = await h.submit(1500)
        serving = h.start()
        await asyncio.to_thread(
            wait_until,
            lambda: len(h.all_events(work.request_id)) >= 6,
            10,
            "some of the reply to stream",
        )
        assert await h.requests.cancel(work) == "aborting"
        assert await asyncio.wait_for(serving, 10) is Outcome.IDLE
        assert h.engine.aborted == [work.request_id]
        ended = (await h.events(work.request_id))[-1]
        assert isinstance(ended, Failed) and ended.code == "cancelled"
        state = await h.state(work.request_id)
        assert state["state"] == "cancelled"
        tokens = int(state["completion_tokens"])
        assert 0 < tokens < 1500, "billed for what was generated before the client left"
        assert [(u.state, u.completion_tokens) for u in await h.usage()] == [("cancelled", tokens)]
        assert h.leases() == []


async def test_a_job_cancelled_while_running_is_aborted_billed_once_and_settled(redis_url):
    async with serving_harness(redis_url, source=SLOW) as h:
        await h.submit_job("job_c", max_tokens=1500)
        serving = h.start()
        await h.wait_running("job_c.1")
        assert await h.jobs.cancel("job_c") == "aborting"
        assert await asyncio.wait_for(serving, 10) is Outcome.IDLE
        assert h.engine.aborted == ["job_c.1"]
        [usage] = await h.usage()
        assert usage.state == "cancelled" and 0 < usage.completion_tokens < 1500
        await JobCollector(h.jobs, Settings(redis_url=redis_url)).pass_once()
        record = await h.jobs.get("job_c")
        assert record.status is JobStatus.CANCELLED
        assert record.usage["completion_tokens"] == usage.completion_tokens


async def test_a_request_cancelled_while_queued_never_reaches_the_engine(redis_url):
    async with serving_harness(redis_url) as h:
        gone, kept = await h.submit(4), await h.submit(4)
        assert await h.requests.cancel(gone) == "withdrawn"
        assert await h.serve() is Outcome.IDLE
        assert set().union(*h.engine.batches) == {kept.request_id}
        assert [u.request_id for u in await h.usage()] == [kept.request_id]


# --- claims while busy ---------------------------------------------------------------------


async def test_a_busy_runner_claims_on_news_of_work_not_between_every_two_steps(redis_url):
    """While a request decodes and both queues are empty, a claim finds nothing: the loop
    makes one only when a script announced work (see WorkNews) or half a second passed.
    A request queued mid-decode still joins the batch at once."""
    async with serving_harness(redis_url, source=SLOW) as h:
        claims: list[float] = []
        claim = h.runner.claim

        def counted(*args, **kwargs):
            claims.append(time.monotonic())
            return claim(*args, **kwargs)

        h.runner.claim = counted
        first = await h.submit(1500)
        serving = h.start()
        await h.wait_running(first.request_id)
        began, steps_before = time.monotonic(), len(h.engine.batches)
        claims_before = len(claims)
        await asyncio.to_thread(
            wait_until, lambda: len(h.engine.batches) >= steps_before + 60, 10, "60 steps"
        )
        steps = len(h.engine.batches) - steps_before
        busy_claims = len([t for t in claims[claims_before:] if t >= began])
        # The design's bound: one claim per half second, and one for a news message
        # still in flight from the first request's enqueue.
        bound = 2 + int((time.monotonic() - began) / 0.5)
        assert busy_claims <= bound < steps, f"{busy_claims} claims in {steps} steps"

        queued_at_step = len(h.engine.batches)
        second = await h.submit(4)
        await h.wait_running(second.request_id)
        joined = next(i for i, b in enumerate(h.engine.batches) if second.request_id in b)
        # Enqueued during step `queued_at_step` at the latest; claimed before the next one,
        # or the one after it when the message came in while a claim was being made.
        assert joined <= queued_at_step + 2, (queued_at_step, joined)
        assert await h.requests.cancel(first) == "aborting"
        assert await asyncio.wait_for(serving, 10) is Outcome.IDLE
        assert h.engine.aborted == [first.request_id], "the cancel was news too"


# --- leases ----------------------------------------------------------------------------------


async def test_the_heartbeat_keeps_a_long_request_leased(redis_url):
    async with serving_harness(redis_url, source=SLOW, lease_ttl_s=0.3, heartbeat_s=0.05) as h:
        work = await h.submit(150)  # 0.75 s of work: several lease lifetimes
        serving = h.start()
        assert await reap_until(h, serving.done) == []
        assert serving.result() is Outcome.IDLE
        assert (await h.events(work.request_id))[-1] == Finished(3, 150)
        assert [u.completion_tokens for u in await h.usage()] == [150]


async def test_a_request_whose_lease_ran_out_is_never_finished_or_billed(redis_url):
    async with serving_harness(redis_url, source=SLOW, lease_ttl_s=0.2) as h:
        work = await h.submit(200)  # no heartbeat: the lease runs out while it runs
        serving = h.start()
        await h.wait_running(work.request_id)
        reaped: list[str] = []
        assert await reap_until(h, lambda: reaped, into=reaped) == [work.request_id]
        assert not serving.done(), "the lease must run out while the request runs"
        assert await asyncio.wait_for(serving, 20) is Outcome.IDLE
        terminal = [e for e in h.all_events(work.request_id) if isinstance(e, Finished | Failed)]
        assert len(terminal) == 1 and terminal[0].code == "runner_lost"
        assert await h.usage() == [], "the client was told it failed: nothing is billed"


# --- async jobs and synchronous traffic ------------------------------------------------------


async def test_a_claim_prefers_synchronous_requests_over_jobs(redis_url):
    async with serving_harness(redis_url, max_concurrency=4) as h:
        for i in range(3):
            await h.submit_job(f"job_{i}")
        sync = [(await h.submit(4)).request_id for _ in range(2)]
        assert await h.serve() is Outcome.IDLE
        first = h.engine.batches[0]
        # Both synchronous requests first; jobs one per step on a runner of 4 slots.
        assert set(sync) <= first and len(first) == 2 + job_claims_per_step(4) == 3
        ran = set().union(*h.engine.batches)
        assert ran == {*sync, "job_0.1", "job_1.1", "job_2.1"}


async def test_jobs_are_claimed_a_few_per_step_so_no_step_prefills_a_whole_batch(redis_url):
    # A synchronous request that arrives waits for the step in progress: one that prefills
    # sixteen jobs at once would hold it as long as sixteen prefills.
    async with serving_harness(redis_url, source=SLOW, max_concurrency=16) as h:
        for i in range(16):
            await h.submit_job(f"job_{i}", max_tokens=40)
        assert await h.serve() is Outcome.IDLE
        per_step = job_claims_per_step(16)
        assert per_step == 2
        batches = h.engine.batches
        before = [frozenset(), *batches[:-1]]
        added = [len(now - was) for was, now in zip(before, batches, strict=True)]
        assert max(added) == per_step, added
        assert max(len(b) for b in batches) == 16, "the batch still filled every slot"


async def test_jobs_fill_every_slot_until_a_synchronous_request_takes_one_back(redis_url):
    async with serving_harness(redis_url, source=SLOW, max_concurrency=4) as h:
        for i in range(5):
            await h.submit_job(f"job_{i}", max_tokens=150)
        serving = h.start()
        await asyncio.to_thread(
            wait_until,
            lambda: any(len(b) == 4 for b in h.engine.batches),
            10,
            "four jobs to run: nothing else wants the runner",
        )
        sync = await h.submit(4)
        assert await asyncio.wait_for(serving, 30) is Outcome.IDLE
        with_sync = [b for b in h.engine.batches if sync.request_id in b]
        # The youngest job gave its slot back at once; the request did not wait for a job
        # to end (each runs 150 steps).
        [given_back] = h.engine.aborted
        assert given_back.startswith("job_") and given_back not in with_sync[0]
        assert len(with_sync[0]) == 4, "the request ran beside three jobs"
        assert job_slots(4) == 3
        assert max(len(b - {sync.request_id}) for b in with_sync) <= 3
        assert (await h.events(sync.request_id))[-1] == Finished(3, 4)
        # The job given back went on from where it was (continued), is billed once, and
        # its output is what an uninterrupted run says.
        assert (await h.events(given_back))[-1] == Finished(3, 150)
        assert text_of(await h.events(given_back)) == text_of(await h.events("job_0.1"))
        steps = sum(given_back in b for b in h.engine.batches)
        assert steps == 150, "150 tokens in all: none generated twice"
        states = await h.jobs.attempt_states([f"job_{i}.1" for i in range(5)])
        assert states == ["finished"] * 5
        billed = [u.request_id for u in await h.usage()]
        assert sorted(billed) == sorted([sync.request_id] + [f"job_{i}.1" for i in range(5)])


async def test_jobs_can_yield_fully_beside_synchronous_requests(redis_url):
    async with serving_harness(redis_url, source=SLOW, max_concurrency=4) as h:
        h.loop.jobs_beside_sync = 0  # EBB_JOB_SLOTS_BESIDE_SYNC=0
        for i in range(6):
            await h.submit_job(f"job_{i}", max_tokens=40)
        serving = h.start()
        await asyncio.to_thread(
            wait_until,
            lambda: any(len(b) == 4 for b in h.engine.batches),
            10,
            "four jobs to run",
        )
        sync = await h.submit(60)
        assert await asyncio.wait_for(serving, 60) is Outcome.IDLE
        with_sync = [b for b in h.engine.batches if sync.request_id in b]
        jobs_beside = set().union(*with_sync) - {sync.request_id}
        assert len(jobs_beside) <= 3, "a job was claimed while the request ran"
        # Once the jobs in flight finished, the request ran alone.
        assert with_sync[-1] == {sync.request_id}
        # The rest wait until synchronous traffic has been quiet for a second.
        states = await h.jobs.attempt_states([f"job_{i}.1" for i in range(6)])
        assert states.count("queued") == 3
        assert await h.serve(idle_s=2) is Outcome.IDLE
        states = await h.jobs.attempt_states([f"job_{i}.1" for i in range(6)])
        assert states == ["finished"] * 6, "the jobs ran once the request was done"


async def test_a_finished_job_attempt_is_collected_as_its_result(redis_url):
    async with serving_harness(redis_url) as h:
        await h.submit_job("job_r", max_tokens=8)
        assert await h.serve() is Outcome.IDLE
        await JobCollector(h.jobs, Settings(redis_url=redis_url)).pass_once()
        record = await h.jobs.get("job_r")
        assert record.status is JobStatus.SUCCEEDED
        assert record.result["choices"][0]["text"] == FAKE_REPLY[:8]
        assert record.usage == {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11}


# --- where the engine computes ---------------------------------------------------------------


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two cores")
async def test_the_engine_steps_on_its_own_core_and_the_threads_beside_it_keep_every_core(
    redis_url, tmp_path
):
    cores = os.sched_getaffinity(0)
    async with serving_harness(redis_url) as h:
        h.loop.engine_thread_placement = functools.partial(own_core, tmp_path, 1)
        engine_cores, publisher_cores, started_cores = [], [], []
        started: list[threading.Thread] = []
        done = threading.Event()
        fake_step = h.engine.step

        def step():
            (publisher,) = [t for t in threading.enumerate() if t.name == "publisher"]
            engine_cores.append(os.sched_getaffinity(0))
            publisher_cores.append(os.sched_getaffinity(publisher.native_id))
            if started:
                started_cores.append(os.sched_getaffinity(started[0].native_id))
            else:  # as vLLM starts a grammar compiler: on demand, from the engine's thread
                started.append(threading.Thread(target=done.wait, args=(10,)))
                started[0].start()
            return fake_step()

        h.engine.step = step
        work = await h.submit(3)
        try:
            assert await h.serve() is Outcome.IDLE
        finally:
            done.set()
        assert (await h.events(work.request_id))[-1] == Finished(3, 3)
        assert engine_cores == [{max(cores)}] * 3, "every step on the last core"
        assert publisher_cores == [cores] * 3, "the publisher keeps its cores"
        assert started_cores == [cores] * 2, "a thread the engine started: cores given back"
        with open(tmp_path / LOCK_FILE, "a") as lock:  # the pin was let go with the run
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


# --- drain rules --------------------------------------------------------------------------------


async def test_an_idle_runner_drains_once_past_its_timeout(redis_url):
    async with serving_harness(redis_url, idle_timeout_s=5) as h:
        assert await h.serve(idle_s=4.9) is Outcome.IDLE
        assert h.runner_state() is RunnerState.READY
        assert await h.serve(idle_s=5) is Outcome.DRAINED
        assert h.runner_state() is RunnerState.DRAINING
        assert await h.platform.scale_decisions() == {(DEP, "down"): 1}


async def test_a_runner_within_min_replicas_never_drains(redis_url):
    async with serving_harness(redis_url, idle_timeout_s=5, min_replicas=1) as h:
        assert await h.serve(idle_s=600) is Outcome.IDLE
        assert h.runner_state() is RunnerState.READY


@pytest.mark.parametrize("kind", ["request", "job"])
async def test_idle_drain_is_refused_while_work_waits(redis_url, kind):
    """Work that lands the instant the runner decides to drain keeps it serving: else it
    would wait for a whole new cold start."""
    async with serving_harness(redis_url, idle_timeout_s=5) as h:
        arrived = h.submit_before_drain(3, job_id="job_late" if kind == "job" else "")
        assert await h.serve(idle_s=60) is Outcome.IDLE
        late = await arrived
        assert h.runner_state() is RunnerState.READY, "the drain was refused"
        assert h.engine.batches == [], "it arrived after the claim"
        assert await h.serve() is Outcome.IDLE
        assert (await h.events(late.request_id))[-1] == Finished(3, 3)
        assert await h.platform.scale_decisions() == {}


async def test_an_idle_runner_that_can_sleep_parks_instead(redis_url):
    async with serving_harness(redis_url, source="fake://m?step_ms=0&sleep=1") as h:
        assert await h.serve(idle_s=120) is Outcome.SLEEP
        assert h.runner_state() is RunnerState.SLEEPING
        assert h.redis.sismember(keys.sleepers(DEP), "r-h")


async def test_a_deleted_deployment_drains_its_runner(redis_url):
    async with serving_harness(redis_url, idle_timeout_s=60) as h:
        assert await h.platform.delete_deployment(DEP)
        assert await h.serve(idle_s=3) is Outcome.DRAINED
        assert h.runner_state() is RunnerState.DRAINING


async def test_asked_to_stop_it_finishes_what_it_holds_and_claims_nothing_more(redis_url):
    async with serving_harness(redis_url, source=SLOW) as h:
        held = await h.submit(100)
        serving = h.start()
        await h.wait_running(held.request_id)
        h.stop.set()
        waiting = await h.submit(3)
        assert await asyncio.wait_for(serving, 20) is Outcome.DRAINED
        assert (await h.events(held.request_id))[-1] == Finished(3, 100)
        assert h.engine.aborted == [], "scale-down never aborts in-flight work"
        assert (await h.state(waiting.request_id))["state"] == "queued"
        assert h.runner_state() is RunnerState.DRAINING
