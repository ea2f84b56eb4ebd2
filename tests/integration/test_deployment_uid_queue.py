"""A deployment's uid in the queue's atomic steps, against a real redis-server: a runner
claims only for the deployment it was launched for, a delete fails what is queued for
every version at once, and sleepers wake only for their own deployment."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import redis
from support.serving_harness import serving_harness

from ebb.queue import keys
from ebb.queue.connection import async_client, sync_client
from ebb.queue.gpus import SLEEPER_EXIT
from ebb.queue.platform import PlatformState
from ebb.queue.requests import RequestQueue
from ebb.queue.runner_side import RunnerQueue
from ebb.queue.schema import (
    DeploymentSpec,
    Failed,
    Finished,
    RunnerRecord,
    RunnerState,
    SamplingSpec,
    WorkItem,
    decode_event,
)
from ebb.queue.version_store import VersionStore
from ebb.queue.versions import VersionRecord
from ebb.runners.serve import Outcome

pytestmark = pytest.mark.integration

DEP = "dep-a"
V2 = "dep-a@v2"


def work(i: str, unit: str = DEP) -> WorkItem:
    return WorkItem(
        request_id=f"req-{i}",
        deployment=unit,
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingSpec(max_tokens=4),
    )


def runner_queue(url: str, runner_id: str) -> RunnerQueue:
    return RunnerQueue(sync_client(url), runner_id, lease_ttl_s=5.0, result_ttl_s=60)


async def create(state: PlatformState, source: str) -> str:
    """A new deployment DEP (with a version 2); its uid."""
    spec = DeploymentSpec(name=DEP, source=source)
    assert await state.put_deployment(spec, create_only=True)
    created = await state.get_deployment(DEP)
    assert created is not None and created.uid.startswith("dep_")
    await VersionStore(state.redis).add(
        DEP, lambda n: VersionRecord(version=n, created_at_s=0.0, spec=created), max_versions=10
    )
    return created.uid


def events(url: str, request_id: str) -> list:
    entries = redis.Redis.from_url(url).xrange(keys.events(request_id))
    return [decode_event(fields[b"e"]) for _, fields in entries]


async def test_a_runner_claims_nothing_for_a_name_created_again_but_finishes_what_it_held(
    redis_url,
):
    client = async_client(redis_url)
    state, queue = PlatformState(client), RequestQueue(client, request_ttl_s=60)
    old_uid = await create(state, "fake://beta")
    held = work("held")
    await queue.enqueue(held, admission_window_s=60, depth_limit=10)
    old = runner_queue(redis_url, "r-old")
    assert [w.request_id for w in old.claim(DEP, 1, uid=old_uid).claimed] == ["req-held"]

    assert await state.delete_deployment(DEP)
    new_uid = await create(state, "fake://evil")
    assert new_uid != old_uid
    theirs = work("theirs")
    await queue.enqueue(theirs, admission_window_s=60, depth_limit=10)
    await queue.enqueue(work("theirs-v2", V2), admission_window_s=60, depth_limit=10)

    for unit in (DEP, V2):
        refused = old.claim(unit, 5, 5, uid=old_uid)
        assert refused.claimed == [] and refused.deployment_gone, unit
    assert (await queue.request_state(theirs.request_id))["state"] == "queued"
    new = runner_queue(redis_url, "r-new")
    taken = new.claim(DEP, 5, uid=new_uid)
    assert [w.request_id for w in taken.claimed] == ["req-theirs"] and not taken.deployment_gone
    # What the old runner held before the delete is still its own to finish (and bill).
    assert old.finish(held, state="finished", event=Finished(3, 1), prompt_tokens=3,
                      completion_tokens=1)  # fmt: skip
    await client.aclose()


async def test_a_runner_of_a_deleted_deployment_claims_nothing(redis_url):
    client = async_client(redis_url)
    state = PlatformState(client)
    uid = await create(state, "fake://a")
    assert await state.delete_deployment(DEP)
    assert runner_queue(redis_url, "r1").claim(DEP, 1, uid=uid).deployment_gone
    # A deployment from before uids ("" on both sides) is not refused by the claim.
    legacy = msgspec.json.encode(DeploymentSpec(name=DEP, source="fake://a"))
    await client.hset(keys.DEPLOYMENTS, DEP, legacy)
    assert not runner_queue(redis_url, "r2").claim(DEP, 1).deployment_gone
    await client.aclose()


async def test_delete_fails_whats_queued_for_every_version_and_tells_sleepers_to_exit(
    redis_url,
):
    client = async_client(redis_url)
    state, queue = PlatformState(client), RequestQueue(client, request_ttl_s=60)
    await create(state, "fake://a")
    waiting = [work("v1"), work("v2", V2)]
    for item in waiting:
        await queue.enqueue(item, admission_window_s=60, depth_limit=10)
    # A job attempt, as job_submit.lua queues one.
    r = redis.Redis.from_url(redis_url)
    r.hset(keys.request("req-job"), mapping={"state": "queued", "job": "job_1", "work": b"{}"})
    r.zadd(keys.job_queue(V2), {"req-job": 1})
    r.sadd(keys.sleepers(DEP), "r-sleepy")

    assert await state.delete_deployment(DEP)
    for request_id in ("req-v1", "req-v2", "req-job"):
        assert (await queue.request_state(request_id))["state"] == "failed"
        [event] = events(redis_url, request_id)
        assert isinstance(event, Failed) and event.code == "deployment_deleted"
    assert r.sismember(keys.JOBS_WATCH, "job_1"), "the collector must settle the job"
    assert r.lrange(keys.runner_assignment("r-sleepy"), 0, -1) == [SLEEPER_EXIT.encode()]
    gone = [keys.queue(DEP), keys.queue(V2), keys.job_queue(V2), keys.sleepers(DEP)]
    gone += [keys.deployment_versions(DEP), keys.traffic(DEP)]
    assert r.exists(*gone) == 0
    assert r.hget(keys.DEPLOYMENT_UIDS, DEP) is None
    assert not await state.delete_deployment(DEP)
    await client.aclose()


async def test_a_sleeper_wakes_only_for_the_deployment_it_was_launched_for(redis_url):
    client = async_client(redis_url)
    state = PlatformState(client)
    for runner_id, uid in (("r-old", "dep_old"), ("r-mine", "dep_mine")):
        await state.put_runner(
            RunnerRecord(
                runner_id=runner_id,
                state=RunnerState.SLEEPING,
                deployment=DEP,
                deployment_uid=uid,
            )
        )
    await client.sadd(keys.sleepers(DEP), "r-old")
    assert await state.take_sleeper(DEP, "dep_mine") is None
    assert await client.lrange(keys.runner_assignment("r-old"), 0, -1) == [SLEEPER_EXIT.encode()]
    await client.sadd(keys.sleepers(DEP), "r-mine")
    assert await state.take_sleeper(DEP, "dep_mine") == "r-mine"
    await client.aclose()


async def test_a_stale_change_never_overwrites_the_deployment_now_under_the_name(redis_url):
    client = async_client(redis_url)
    state = PlatformState(client)
    await create(state, "fake://beta")
    read_before_delete = await state.get_deployment(DEP)
    assert read_before_delete is not None
    assert await state.delete_deployment(DEP)
    new_uid = await create(state, "fake://evil")
    patched = msgspec.structs.replace(read_before_delete, max_replicas=9)
    assert not await state.put_deployment(patched)
    now = await state.get_deployment(DEP)
    assert now is not None and (now.uid, now.source) == (new_uid, "fake://evil")
    assert await client.hget(keys.DEPLOYMENT_UIDS, DEP) == new_uid.encode()
    await client.aclose()


async def test_a_serving_runner_finishes_what_it_holds_then_drains_taking_nothing_new(redis_url):
    async with serving_harness(redis_url, source="fake://m?step_ms=5", uid="dep_beta") as h:
        held = await h.submit(100)
        serving = h.start()
        await h.wait_running(held.request_id)
        assert await h.platform.delete_deployment(h.spec.name)
        evil = DeploymentSpec(name=h.spec.name, source="fake://evil")
        assert await h.platform.put_deployment(evil, create_only=True)
        theirs = await h.submit(3)
        assert await asyncio.wait_for(serving, 20) is Outcome.DRAINED
        assert (await h.events(held.request_id))[-1] == Finished(3, 100)
        assert (await h.state(theirs.request_id))["state"] == "queued"
        assert h.runner_state() is RunnerState.DRAINING


async def test_a_runner_fails_a_request_admitted_for_another_deployment_of_its_name(redis_url):
    async with serving_harness(redis_url, uid="dep_new") as h:
        stale = await h.submit(3, deployment_uid="dep_deleted")
        assert await h.serve() is Outcome.IDLE
        last = (await h.events(stale.request_id))[-1]
        assert isinstance(last, Failed) and last.code == "deployment_deleted"
        [usage] = await h.usage()
        assert (usage.state, usage.prompt_tokens, usage.completion_tokens) == ("failed", 0, 0)
        assert h.engine.batches == [], "its engine never saw the request"
