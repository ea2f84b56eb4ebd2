"""Cold-start failure handling on the fake engine: crash loops back off into an error state,
a SIGKILLed runner's requests end with an error, and every start shows up in the metrics."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from support import deploy, deployment, sigkill_runner_mid_stream, wait_until

from ebb.coldstart.controller import MAX_START_FAILURES
from ebb.queue import keys
from ebb.queue.connection import async_client
from ebb.queue.platform import PlatformState

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def test_crash_while_loading_backs_off_into_an_error_state(platform, admin):
    deploy(admin, "broken", "fake://m?fail=1", admission_timeout_s=2)
    client = platform.openai()

    def retrying_client_sees_failing() -> dict | None:
        # Like a client honouring 503s: each retry is demand that triggers another start.
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="broken", messages=MESSAGES, max_tokens=2)
        assert refused.value.status_code == 503
        return (d := deployment(admin, "broken"))["status"] == "failing" and d

    failing = wait_until(retrying_client_sees_failing, 90, "the deployment's error state")
    assert "failed to load" in failing["error"]
    assert "failed" in (failing["error_log"] or ""), "the runner's last log lines are shown"
    states = [r["state"] for r in failing["runners"]]
    assert states.count("failed") >= MAX_START_FAILURES
    assert len(states) <= MAX_START_FAILURES + 1, "backoff, not a crash loop"

    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="broken", messages=MESSAGES, max_tokens=2)
    assert refused.value.status_code == 503
    assert refused.value.body["code"] == "deployment_failing"
    assert "failed to load" in refused.value.body["message"]
    assert int(refused.value.response.headers["retry-after"]) >= 1


def test_sigkilled_runner_ends_its_streams_with_an_error(platform, admin):
    deploy(admin, "victim", "fake://m?step_ms=40", idle_timeout_s=60)
    # Two choices: no continuation can replay them (one would go on, see
    # test_continuation.py); the loss is the answer.
    runner, events = sigkill_runner_mid_stream(admin, "victim", n=2)
    pid = runner["pid"]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][len("data: ") :])["error"]
    assert error["code"] == "runner_lost"
    killed = wait_until(
        lambda: [
            r
            for r in deployment(admin, "victim")["runners"]
            if r["pid"] == pid and r["state"] == "failed"
        ],
        30,
        "the controller to mark the killed runner failed",
    )
    assert killed


def test_cold_starts_and_scale_decisions_are_metrics(platform, admin):
    deploy(admin, "counted", "fake://m", idle_timeout_s=1)
    platform.openai().chat.completions.create(model="counted", messages=MESSAGES, max_tokens=2)
    wait_until(
        lambda: deployment(admin, "counted")["runners"][0]["state"] == "exited",
        30,
        "the runner to drain",
    )

    def scraped() -> str | None:
        text = admin.get("/metrics").text
        return 'ebb_scale_decisions_total{deployment="counted",direction="down"}' in text and text

    text = wait_until(scraped, 10, "the drain to be counted")
    for phase in ("total", "first_token"):
        labels = f'deployment="counted",phase="{phase}",tier="fresh"'
        assert f"ebb_cold_start_seconds_count{{{labels}}} 1.0" in text
    # The fake engine imports nothing, so it has no import phase.
    phases = deployment(admin, "counted")["cold_start_ms"]["fresh"]
    assert {"spawn", "weights", "engine", "total", "first_token"} <= set(phases)
    assert 'ebb_scale_decisions_total{deployment="counted",direction="up"} 1.0' in text
    assert 'ebb_runners{deployment="counted",state="ready"} 0.0' in text


def test_an_engine_that_can_sleep_parks_when_idle_and_wakes_for_work(platform, admin):
    # The fake engine stands in for vLLM on a GPU, where sleep mode exists (sleep=1).
    deploy(admin, "sleepy", "fake://m?sleep=1", idle_timeout_s=1)
    client = platform.openai()
    client.chat.completions.create(model="sleepy", messages=MESSAGES, max_tokens=2)
    asleep = wait_until(
        lambda: (d := deployment(admin, "sleepy"))["status"] == "sleeping" and d,
        30,
        "the idle runner to fall asleep instead of exiting",
    )
    [runner] = asleep["runners"]
    assert runner["state"] == "sleeping"

    reply = client.chat.completions.create(model="sleepy", messages=MESSAGES, max_tokens=3)
    assert reply.usage.completion_tokens == 3
    woken = deployment(admin, "sleepy")
    assert [r["id"] for r in woken["runners"]] == [runner["id"]], "woken, not relaunched"
    assert {"wake", "first_token"} <= set(woken["cold_start_ms"]["sleeping"])


def _ask_to_drain(platform, runner_id: str, name: str) -> None:
    """What a scaling policy's scale-in does (`DrainReady`): ask a ready runner to drain."""
    url = json.loads((platform.home / "run.json").read_text())["redis_url"]

    async def ask() -> None:
        client = async_client(url)
        await PlatformState(client).drain_ready(runner_id, name)
        await client.aclose()

    asyncio.run(ask())


def test_a_policy_gives_back_an_idle_runner_that_can_sleep_by_sleep_not_exit(platform, admin):
    # The hybrid keep-alive (and slo/utilisation scale-in) gives back an idle runner: where
    # its engine can sleep, it sleeps, as its own idle timeout would have had it do, so the
    # next request wakes it in seconds instead of paying a cold start.
    deploy(admin, "given", "fake://m?sleep=1", idle_timeout_s=600)
    client = platform.openai()
    client.chat.completions.create(model="given", messages=MESSAGES, max_tokens=2)
    [runner] = [r for r in deployment(admin, "given")["runners"] if r["state"] == "ready"]
    _ask_to_drain(platform, runner["id"], "given")
    wait_until(
        lambda: deployment(admin, "given")["status"] == "sleeping",
        30,
        "the runner given back to fall asleep instead of exiting",
    )
    # A request made before it slept concerned the runner as it was then: once woken for
    # new work, it is not read again (else the woken runner would drain at once).
    _ask_to_drain(platform, runner["id"], "given")
    reply = client.chat.completions.create(model="given", messages=MESSAGES, max_tokens=3)
    assert reply.usage.completion_tokens == 3
    woken = deployment(admin, "given")
    assert [r["id"] for r in woken["runners"]] == [runner["id"]], "woken, not relaunched"
    assert {r["state"] for r in woken["runners"]} == {"ready"}
    assert not platform.redis().hexists(keys.runner(runner["id"]), keys.RUNNER_DRAIN_REQUESTED)


def test_engines_without_sleep_mode_never_sleep(admin):
    # The CPU case: the vLLM adapter reports no sleep support, like this fake engine.
    assert "sleeping" not in deployment(admin, "counted")["cold_start_ms"]
    assert {r["state"] for r in deployment(admin, "counted")["runners"]} == {"exited"}
