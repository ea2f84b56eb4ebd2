"""A hung engine is found by its runner's own watchdog, not by a client's timeout.

The fake engine's `hang_after=N` blocks inside a step, releasing the GIL, as a deadlocked
engine would: the runner's heartbeat thread lives on and keeps its leases fresh, so the
reaper never sees the runner as lost. With `EBB_ENGINE_STALL_S` the runner kills itself
once a step has run that long, its leases expire at once, the stall is counted, and its
requests get an outcome. (`hang_once=1`: the runner a request moves to does not hang.)
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
import redis
from support import Platform, deploy, deployment, temp_home, wait_until
from support.metrics import scrape

from ebb.queue import keys
from ebb.queue.connection import async_client, sync_client
from ebb.queue.observations import ObservationReader
from ebb.queue.platform import PlatformState
from ebb.queue.requests import RequestQueue
from ebb.queue.runner_side import RunnerQueue
from ebb.queue.schema import RunnerRecord, RunnerState, SamplingSpec, WorkItem
from ebb.testing.fake_model import FAKE_REPLY

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
STALL_S = 2
# How long a test waits for an outcome: well past the stall limit, a heartbeat, a reap
# tick and a cold start of the fake engine, and far below a hang's hour.
OUTCOME_WAIT_S = 60


@pytest.fixture(scope="module")
def platform():
    env = {"EBB_ENGINE_STALL_S": str(STALL_S)}
    p = Platform(home=temp_home("ebb-stall-"), redis_url=None, env_extra=env).start()
    yield p
    assert p.stop() == 0


def _stalled_runner(admin: httpx.Client, name: str) -> dict:
    """The runner of `name` its watchdog ended, as the API shows it."""
    return wait_until(
        lambda: next(
            (
                r
                for r in deployment(admin, name)["runners"]
                if r["state"] == "failed" and "stalled" in (r["error"] or "")
            ),
            None,
        ),
        OUTCOME_WAIT_S,
        f"a runner of {name} marked failed for its stalled engine",
    )


def _stalls_counted(admin: httpx.Client, name: str) -> float:
    return wait_until(
        lambda: scrape(admin).value("ebb_engine_stalls_total", deployment=name),
        OUTCOME_WAIT_S,
        f"the stall of {name} on /metrics",
    )


def test_a_request_whose_engine_hangs_before_output_runs_on_another_runner(platform, admin):
    deploy(admin, "hang-prefill", "fake://hang-prefill?hang_after=0&hang_once=1")
    # Counted from zero, so that an alert on its increase sees the first stall.
    assert {"deployment": "hang-prefill"} in scrape(admin).labels_of("ebb_engine_stalls_total")
    client = platform.openai(timeout=OUTCOME_WAIT_S)
    # Without the watchdog this times out: the hung runner's heartbeat renews the lease.
    reply = client.chat.completions.create(model="hang-prefill", messages=MESSAGES, max_tokens=8)
    assert reply.choices[0].message.content == "The capi"
    assert reply.usage.completion_tokens == 8
    stalled = _stalled_runner(admin, "hang-prefill")
    assert f"no step for {STALL_S}" in stalled["error"]
    # Its log shows where the engine hung: the engine thread's stack, innermost first.
    log_text = (platform.home / "logs" / f"runner-{stalled['id']}.log").read_text()
    assert "in _maybe_hang" in log_text.split("engine stalled")[-1]
    assert _stalls_counted(admin, "hang-prefill") == 1
    served = [r for r in deployment(admin, "hang-prefill")["runners"] if r["state"] == "ready"]
    assert served and served[0]["id"] != stalled["id"]


def test_a_stream_whose_engine_hangs_mid_generation_goes_on_on_another_runner(platform, admin):
    deploy(admin, "hang-decode", "fake://hang-decode?hang_after=5&hang_once=1")
    body = {"model": "hang-decode", "messages": MESSAGES, "max_tokens": 30, "stream": True}
    deadline = time.monotonic() + OUTCOME_WAIT_S
    events: list[str] = []
    # Keep-alives could hold a hung stream open for ever: the deadline ends the wait.
    with admin.stream("POST", "/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
            if events[-1:] == ["[DONE]"] or time.monotonic() > deadline:
                break
    assert events[-1:] == ["[DONE]"], f"the stream got no outcome: {events[-3:]}"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")
    )
    # Continuation by token replay: the stalled runner's stream goes on, on another runner,
    # from the token after its last, to the end.
    assert not [c for c in chunks if "error" in c]
    assert text == FAKE_REPLY[:30], "nothing repeated or missing"
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    assert reasons[-1] == "length"
    _stalled_runner(admin, "hang-decode")
    assert _stalls_counted(admin, "hang-decode") == 1


async def test_a_stall_gives_the_held_requests_up_at_once_and_is_counted(redis_url):
    client = async_client(redis_url)
    queue, state = RequestQueue(client, request_ttl_s=60), PlatformState(client)
    held = [
        WorkItem(
            request_id=f"req-{i}",
            deployment="dep-a",
            prompt_token_ids=[1, 2, 3],
            sampling=SamplingSpec(max_tokens=4),
        )
        for i in range(2)
    ]
    for work in held:
        await queue.enqueue(work, admission_window_s=10, depth_limit=10)
    runner = RunnerQueue(sync_client(redis_url), "r-hung", lease_ttl_s=60, result_ttl_s=60)
    runner.register(RunnerRecord(runner_id="r-hung", state=RunnerState.READY, deployment="dep-a"))
    assert len(runner.claim("dep-a", 2).claimed) == 2
    runner.heartbeat([w.request_id for w in held], engine_steps=7, engine_busy_ms=1234)
    record = runner.record()
    assert record is not None and (record.engine_steps, record.engine_busy_ms) == (7, 1234)
    assert await state.reap_expired_leases() == [], "the heartbeat renewed them for 60 s"

    assert runner.record_engine_stall("dep-a", [w.request_id for w in held], "stalled") == 2
    assert sorted(await state.reap_expired_leases()) == ["req-0", "req-1"]
    record = runner.record()
    assert record is not None and (record.state, record.error) == (RunnerState.FAILED, "stalled")
    assert record.exited_ms > 0
    counters = await ObservationReader(client).counters()
    assert counters["engine_stalls"] == [(("dep-a",), 1.0)]
    assert not redis.Redis.from_url(redis_url).exists(keys.claiming("dep-a"))
    await client.aclose()
