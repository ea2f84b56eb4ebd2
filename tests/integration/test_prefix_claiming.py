"""Prefix-aware claiming against a real redis-server: a request whose prompt prefix another
ready runner served last is left for that runner (and that runner is woken), never past
the affinity wait, or past the step wait while that runner has not claimed since the
request came; a full, draining or silent owner, a short prompt, or affinity off mean
plain oldest-first claiming."""

from __future__ import annotations

import pytest
import redis
from support import Platform, deploy, deployment, temp_home, wait_until
from support.claiming import enqueue
from support.metrics import scrape

from ebb.queue import keys
from ebb.queue.connection import sync_client
from ebb.queue.prefix import BLOCK_TOKENS, PREFIX_TOKENS, prefix_key
from ebb.queue.runner_side import RunnerQueue
from ebb.queue.schema import RunnerRecord, RunnerState, SamplingSpec, WorkItem

pytestmark = pytest.mark.integration

DEP = "dep-p"
SYSTEM = list(range(1000, 1000 + PREFIX_TOKENS))  # a shared system prompt
OTHER = list(range(5000, 5000 + PREFIX_TOKENS))


def work(name: str, prompt: list[int]) -> WorkItem:
    return WorkItem(
        request_id=f"req-{name}",
        deployment=DEP,
        prompt_token_ids=prompt,
        sampling=SamplingSpec(max_tokens=4),
    )


def runner(url: str, runner_id: str, affinity_ms: int, step_wait_ms: int = 0) -> RunnerQueue:
    rq = RunnerQueue(
        sync_client(url),
        runner_id,
        lease_ttl_s=5.0,
        result_ttl_s=60,
        prefix_affinity_ms=affinity_ms,
        prefix_step_wait_ms=step_wait_ms,
    )
    rq.register(
        RunnerRecord(
            runner_id=runner_id,
            state=RunnerState.READY,
            deployment=DEP,
            heartbeat_ms=_redis_now_ms(url),
        )
    )
    return rq


def _redis_now_ms(url: str) -> int:
    seconds, micros = redis.Redis.from_url(url).time()
    return seconds * 1000 + micros // 1000


def _waited_ms(url: str, request_id: str) -> tuple[int, str]:
    """How long `request_id` waited between its enqueue and its claim, and by whom."""
    fields = redis.Redis.from_url(url).hmget(
        keys.request(request_id), "enqueued_ms", "claimed_ms", "runner"
    )
    return int(fields[1]) - int(fields[0]), fields[2].decode()


def claimed_ids(rq: RunnerQueue, count: int = 4) -> list[str]:
    return [w.request_id for w in rq.claim(DEP, count).claimed]


def test_the_key_covers_whole_blocks_of_the_first_tokens():
    assert prefix_key(SYSTEM + [1, 2, 3]) == prefix_key(SYSTEM + [9]) != prefix_key(OTHER)
    assert prefix_key(list(range(BLOCK_TOKENS - 1))) == ""
    assert prefix_key(list(range(BLOCK_TOKENS))) == prefix_key(list(range(BLOCK_TOKENS + 5)))


async def test_a_prefix_is_left_for_the_runner_that_served_it(redis_url, queue):
    a, b = runner(redis_url, "ra", 10_000), runner(redis_url, "rb", 10_000)
    await enqueue(queue, work("first", SYSTEM + [1]))
    assert claimed_ids(a) == ["req-first"]  # a now holds the system prompt's prefix

    await enqueue(queue, work("same", SYSTEM + [2]), work("other", OTHER + [3]))
    assert claimed_ids(b) == ["req-other"]  # the same-prefix one waits for a
    # b's claim woke a (the queue's own wake token may have gone to b).
    assert redis.Redis.from_url(redis_url).llen(keys.runner_signal("ra")) == 1
    assert claimed_ids(a) == ["req-same"]


async def test_no_request_waits_past_the_affinity_wait(redis_url, queue):
    affinity_ms = 300
    a, b = runner(redis_url, "ra", affinity_ms), runner(redis_url, "rb", affinity_ms)
    await enqueue(queue, work("first", SYSTEM + [1]))
    assert claimed_ids(a) == ["req-first"]
    await enqueue(queue, work("late", SYSTEM + [2]))

    # a never claims again (busy elsewhere, say): b gets it once the wait has passed.
    wait_until(lambda: claimed_ids(b) == ["req-late"], 10, "b to take the waiting request")
    waited_ms, by = _waited_ms(redis_url, "req-late")
    assert by == "rb" and waited_ms >= affinity_ms


async def test_past_the_affinity_wait_an_owner_inside_a_step_is_still_waited_for(redis_url, queue):
    affinity_ms = 100
    a = runner(redis_url, "ra", affinity_ms, step_wait_ms=10_000)
    b = runner(redis_url, "rb", affinity_ms, step_wait_ms=10_000)
    await enqueue(queue, work("first", SYSTEM + [1]))
    assert claimed_ids(a) == ["req-first"]  # a's last claim: then a long prefill step
    await enqueue(queue, work("same", SYSTEM + [2]))
    enqueued_ms = int(redis.Redis.from_url(redis_url).hget(keys.request("req-same"), "enqueued_ms"))
    wait_until(
        lambda: _redis_now_ms(redis_url) - enqueued_ms > affinity_ms, 10, "the affinity wait"
    )

    assert claimed_ids(b) == []  # a has not claimed since the request came
    assert claimed_ids(a) == ["req-same"]  # its step over, a claims it
    waited_ms, by = _waited_ms(redis_url, "req-same")
    assert by == "ra" and waited_ms > affinity_ms


async def test_no_request_waits_for_an_owner_inside_a_step_past_the_step_wait(redis_url, queue):
    affinity_ms, step_wait_ms = 100, 400
    a = runner(redis_url, "ra", affinity_ms, step_wait_ms=step_wait_ms)
    b = runner(redis_url, "rb", affinity_ms, step_wait_ms=step_wait_ms)
    await enqueue(queue, work("first", SYSTEM + [1]))
    assert claimed_ids(a) == ["req-first"]
    await enqueue(queue, work("late", SYSTEM + [2]))

    # a stays inside its step (it never claims again): b gets it once the step wait passed.
    wait_until(lambda: claimed_ids(b) == ["req-late"], 10, "b to take the waiting request")
    waited_ms, by = _waited_ms(redis_url, "req-late")
    assert by == "rb" and waited_ms >= step_wait_ms


@pytest.mark.parametrize("owner_is", ["full", "draining", "silent"])
async def test_an_owner_that_cannot_take_it_is_not_waited_for(redis_url, queue, owner_is):
    a, b = runner(redis_url, "ra", 10_000), runner(redis_url, "rb", 10_000)
    await enqueue(queue, work("first", SYSTEM + [1]))
    assert claimed_ids(a, count=1) == ["req-first"]  # a has no room left (0 of 1 free)
    if owner_is == "draining":
        a.claim(DEP, 4)  # room again, but then it drains
        a.set_fields(state=RunnerState.DRAINING)
    elif owner_is == "silent":
        a.claim(DEP, 4)
        long_ago_ms = _redis_now_ms(redis_url) - 60_000
        a.set_fields(heartbeat_ms=long_ago_ms, polled_ms=long_ago_ms)
    await enqueue(queue, work("same", SYSTEM + [2]))
    assert claimed_ids(b) == ["req-same"]


async def test_an_owner_that_claims_counts_as_alive_before_its_first_heartbeat(redis_url, queue):
    a, b = runner(redis_url, "ra", 10_000), runner(redis_url, "rb", 10_000)
    a.set_fields(heartbeat_ms=0)  # just ready: its heartbeat thread has not beaten yet
    await enqueue(queue, work("first", SYSTEM + [1]))
    assert claimed_ids(a) == ["req-first"]
    await enqueue(queue, work("same", SYSTEM + [2]))
    assert claimed_ids(b) == []  # left for a, which claimed a moment ago
    assert claimed_ids(a) == ["req-same"]


async def test_short_prompts_and_affinity_off_claim_oldest_first(redis_url, queue):
    a, b = runner(redis_url, "ra", 10_000), runner(redis_url, "rb", 0)
    await enqueue(queue, work("first", SYSTEM + [1]))
    assert claimed_ids(a) == ["req-first"]
    await enqueue(queue, work("short", [1, 2, 3]), work("same", SYSTEM + [2]))
    assert sorted(claimed_ids(b)) == ["req-same", "req-short"]  # b waits for nobody


async def test_a_claimed_prefix_is_recorded_as_the_runners_with_an_expiry(redis_url, queue):
    a = runner(redis_url, "ra", 10_000)
    await enqueue(queue, work("first", SYSTEM + [1]))
    claimed_ids(a)
    r = redis.Redis.from_url(redis_url)
    assert r.hget(keys.prefix_owners(DEP), prefix_key(SYSTEM)).decode().startswith("ra|")
    assert 0 < r.ttl(keys.prefix_owners(DEP)) <= keys.PREFIX_OWNERS_TTL_S


@pytest.fixture(scope="module")
def platform():
    # A long affinity wait: on a loaded machine the owner may take a while to wake, and
    # this test is about where a request goes, not how long it may wait (see above).
    p = Platform(
        home=temp_home("ebb-it-prefix-"),
        redis_url=None,
        env_extra={"EBB_PREFIX_AFFINITY_MS": "10000"},
    ).start()
    yield p
    assert p.stop() == 0


def test_through_the_platform_a_shared_prompt_stays_on_one_runner(platform, admin):
    """Two ready runners of one deployment: every request that starts with the same long
    system prompt is served by the runner that served it first."""
    # The fake engine's prefix cache: a runner prefills what it served recently for free.
    deploy(
        admin,
        "pfx",
        source="fake://m?step_ms=5&prefill_ms_per_1k_tokens=5",
        min_replicas=2,
        max_replicas=2,
    )
    wait_until(lambda: deployment(admin, "pfx")["replicas"]["ready"] == 2, 60, "two ready runners")
    client = platform.openai()
    system = {"role": "system", "content": "You are a terse assistant. " * 12}  # > 256 B
    r = platform.redis()
    served_by = []
    for i in range(6):
        reply = client.chat.completions.create(
            model="pfx",
            messages=[system, {"role": "user", "content": f"Question {i}?"}],
            max_tokens=4,
        )
        served_by.append(r.hget(keys.request(reply.id), "runner").decode())
    assert len(set(served_by)) == 1, served_by
    # ...so every request after the first found the system prompt in that runner's cache
    # (what makes its first token come sooner there; bench.prefix --fake measures it).
    prompt_bytes = len(system["content"])

    def hits() -> float:
        return scrape(admin).value("ebb_prefix_cache_hit_tokens_total", deployment="pfx")

    wait_until(lambda: hits() >= 5 * prompt_bytes, 10, "the runner's prefix-cache figures")
