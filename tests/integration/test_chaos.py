"""The chaos suite: `ebb up` (fake engine, its own supervised Redis) under steady mixed
load while each of its processes and Redis is SIGKILLed in turn (tests/support/chaos.py). Then:
no 500s and no stream cut silently; every job finished once, billed once, delivered
under one webhook id; the ledger says what the clients were told; reconcile is clean."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from support import Platform, deploy, temp_home, wait_until
from support.billing import ledger_caught_up, raw_usage
from support.chaos import Chaos, Load, SyncLoad, run_chaos, summary
from support.reliability import SETTLED, Figure, Submitter, _count_receptions
from support.webhook_receiver import Receiver
from test_jobs import FAST_RETRIES, job_body

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def platform():
    env = {**FAST_RETRIES, "EBB_BILLING_CLOSE_GRACE_S": "3600"}
    p = Platform(home=temp_home("ebb-chaos-"), redis_url=None, env_extra=env).start()
    yield p
    assert p.stop() == 0


def test_sigkill_each_process_and_redis_under_load(platform, admin):
    started = time.monotonic()
    deploy(admin, "chaos", source="fake://m?step_ms=5", max_concurrency=8)
    key = admin.post("/v1/keys", json={"tenant": "chaos"}).json()["key"]
    receiver = Receiver(fail_first=1).start()  # every delivery is retried once
    chaos = Chaos(platform)
    load = Load(
        streams=SyncLoad(platform, key, "chaos", stream=True, chaos=chaos),
        plain=SyncLoad(platform, key, "chaos", stream=False, chaos=chaos),
        jobs=Submitter(platform, job_body("chaos", receiver.url, max_tokens=8), gap_s=0.3),
    )
    try:
        run_chaos(platform, load, chaos)
        print("chaos:", summary(load, chaos))
        _check_sync(load)
        job_ids = list(dict.fromkeys(load.jobs.ids))
        _check_jobs(admin, receiver, job_ids)
    finally:
        receiver.stop()
    _check_billing(platform, load, job_ids)
    reconciled = platform.cli("usage", "reconcile", "--json")
    assert reconciled.returncode == 0, reconciled.stdout + reconciled.stderr
    assert json.loads(reconciled.stdout)["ok"]
    print(f"chaos: checked in {time.monotonic() - started:.0f}s")


def _check_sync(load: Load) -> None:
    outcomes = load.outcomes
    bad = [o for o in outcomes if o.ended == "bad"]
    assert not bad, bad[:5]
    # A broken connection is what a SIGKILLed frontdoor leaves its clients; nothing else
    # may cut one.
    assert {o.phase for o in outcomes if o.ended == "transport"} <= {"frontdoor"}
    codes = Counter(o.detail for o in outcomes if o.ended == "error_event")
    assert set(codes) <= {"runner_lost", "redis_unavailable"}, codes
    refused = Counter(o.detail for o in outcomes if o.ended == "refused")
    assert set(refused) <= {"redis_unavailable", "admission_timeout"}, refused
    assert all(o.request_id and o.usage for o in outcomes if o.ended == "done")


def _check_jobs(admin, receiver: Receiver, job_ids: list[str]) -> None:
    assert len(job_ids) >= 10

    def view(job_id: str) -> dict | None:
        response = admin.get(f"/v1/jobs/{job_id}")
        body = response.json() if response.status_code == 200 else {}
        return body if body.get("status") in SETTLED else None

    views = [wait_until(lambda j=j: view(j), 120, f"job {j} to settle") for j in job_ids]
    assert [v["status"] for v in views] == ["succeeded"] * len(job_ids)
    wait_until(
        lambda: all(receiver.accepted(j, "job.succeeded") for j in job_ids),
        120,
        "every job.succeeded delivery",
    )
    figure = Figure()
    _count_receptions(figure, receiver, job_ids)
    assert figure.events_with_two_ids == 0, "an event was announced under two webhook ids"


def _check_billing(platform: Platform, load: Load, job_ids: list[str]) -> None:
    client = platform.redis()
    wait_until(lambda: ledger_caught_up(client), 60, "the ledger to fold every record")
    billed = [r for r in raw_usage(client) if r.state == "finished"]
    per_id = Counter(r.request_id for r in billed)
    jobs = set(job_ids)
    job_attempts = Counter(r.request_id.rsplit(".", 1)[0] for r in billed if r.tenant != "chaos")
    assert set(job_attempts) >= jobs
    assert {j: job_attempts[j] for j in jobs} == dict.fromkeys(jobs, 1), "jobs billed once"
    sync = {r.request_id: r for r in billed if r.tenant == "chaos"}
    assert all(per_id[rid] == 1 for rid in sync), "a synchronous request billed twice"
    told = {o.request_id: o.usage for o in load.outcomes if o.ended == "done"}
    for rid, usage in told.items():
        record = sync[rid]
        assert (record.prompt_tokens, record.completion_tokens) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
        ), rid
    # Billed without the client being told: only work whose client was cut off by a kill
    # (the runner finished a request whose frontdoor or Redis connection was gone).
    cut = [o for o in load.outcomes if o.ended in ("transport", "error_event")]
    unseen = set(sync) - set(told)
    known_cut = {o.request_id for o in cut if o.request_id}
    assert len(unseen - known_cut) <= sum(1 for o in cut if not o.request_id), unseen
