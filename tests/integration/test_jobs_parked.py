"""A job submitted while its deployment's weights are being prepared (issue 36) is
accepted parked instead of refused 503 `weights_preparing`: it shows `waiting_for`, the
frontdoor's watcher queues it, tokenized, once the weights are ready, and the collector
expires it at its TTL naming what it waited for. Weights that failed fail it at once. A
batch created meanwhile keeps its lines pending, and queues all of them once ready.

The frontdoor's services run in this process on a real Redis, with the real catalog; the
test plays the preparer by writing the deployment's weights status (the tokenizer is a
real one, read from a checkpoint directory once "ready")."""

from __future__ import annotations

import json
import time

import pytest
from support.weights import write_servable_dir

from ebb.config import Settings
from ebb.frontdoor import (
    batch_queueing,
    job_requests,
    parked_jobs,
    routes_jobs,
    routes_jobs_read,
)
from ebb.frontdoor.batches import InputLine
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.services import build_services
from ebb.queue import keys
from ebb.queue.batch_store import BatchRecord, BatchStatus
from ebb.queue.job_schema import JobStatus
from ebb.queue.schema import DeploymentSpec, decode_work
from ebb.queue.weights_status import WeightsState, WeightsStatus
from ebb.webhooks.collector import JobCollector

pytestmark = pytest.mark.integration

CALLER = Caller(tenant="acme", key_id="k1", is_admin=False)
BODY = {"prompt": "the capital of france is", "max_tokens": 3}


@pytest.fixture
async def services(redis_url, monkeypatch):
    monkeypatch.setenv("EBB_REDIS_URL", redis_url)
    settings = Settings(redis_url=redis_url, webhook_allowed_networks=["127.0.0.0/8"])
    svc = build_services(settings)
    spec = DeploymentSpec(name="m", source="/checkpoints/m", owner="acme", admission_timeout_s=0.5)
    assert await svc.state.put_deployment(spec, create_only=True)
    await _weights(svc, WeightsStatus(WeightsState.PREPARING))
    yield svc
    await svc.state.short_redis.aclose()
    await svc.redis.aclose()


async def _weights(services, status: WeightsStatus) -> None:
    await services.state.set_deployment_status("m", **status.fields())


async def _submit(services, **extra) -> dict:
    payload = job_requests.JobCreate(model="m", endpoint="completions", body=BODY, **extra)
    response = await routes_jobs._submit(payload, CALLER, services, None, None, 0)
    assert response.status_code == 202, response.body
    return json.loads(response.body)


async def test_a_job_submitted_while_weights_are_prepared_is_queued_once_they_are(
    services, tmp_path
):
    job = await _submit(services)
    assert (job["status"], job["waiting_for"]) == ("queued", "weights_preparing")
    assert await parked_jobs.queue_parked(services, job["id"]) == "waiting"
    assert not await services.redis.zcard(keys.job_queue("m"))  # nothing to run yet

    checkpoint = write_servable_dir(tmp_path / "m", mib=1)
    await _weights(
        services, WeightsStatus(WeightsState.READY, path=str(checkpoint), max_model_len=256)
    )
    assert await parked_jobs.queue_parked(services, job["id"]) == "queued"
    assert await parked_jobs.queue_parked(services, job["id"]) == "gone"  # queued once

    record = await services.jobs.get(job["id"])
    assert record.status is JobStatus.QUEUED and not record.waiting_for
    queued = await services.redis.zrange(keys.job_queue("m"), 0, -1)
    assert [q.decode() for q in queued] == [record.request_id]
    raw = await services.redis.hget(keys.request(record.request_id), "work")
    work = decode_work(raw)
    assert len(work.prompt_token_ids) == 5 and work.sampling.max_tokens == 3
    view = await routes_jobs_read.read_job_view(services, job["id"])
    assert (view["status"], view["waiting_for"]) == ("queued", None)


async def test_a_parked_job_fails_at_once_when_its_weights_fail(services):
    job = await _submit(services)
    failed = WeightsStatus(
        WeightsState.FAILED, error="no config.json", error_code="weights_invalid"
    )
    await _weights(services, failed)
    assert await parked_jobs.queue_parked(services, job["id"]) == "failed"
    record = await services.jobs.get(job["id"])
    assert record.status is JobStatus.FAILED
    assert (record.error.code, record.error.message) == ("weights_invalid", "no config.json")
    assert not await services.redis.zcard(keys.JOBS_PARKED)


async def test_a_parked_job_expires_at_its_ttl_naming_what_it_waited_for(services):
    job = await _submit(services, ttl_s=1)
    await services.redis.zadd(keys.JOBS_WAITING, {job["id"]: 0})  # its deadline has passed
    await JobCollector(services.jobs, services.settings).pass_once()
    record = await services.jobs.get(job["id"])
    assert record.status is JobStatus.EXPIRED
    assert "waiting for weights_preparing" in record.error.message
    assert await parked_jobs.queue_parked(services, job["id"]) == "gone"


async def test_a_parked_job_can_be_cancelled(services):
    job = await _submit(services)
    assert await services.jobs.cancel(job["id"]) == "withdrawn"
    record = await services.jobs.get(job["id"])
    assert record.status is JobStatus.CANCELLED
    assert await parked_jobs.queue_parked(services, job["id"]) == "gone"


async def test_a_batch_created_while_weights_are_prepared_queues_every_line_once_ready(
    services, tmp_path
):
    record = BatchRecord(
        batch_id="batch_1",
        tenant="acme",
        key_id="k1",
        endpoint="/v1/completions",
        input_file_id="file_1",
        completion_window="24h",
        created_at_s=int(time.time()),
        expires_at_s=int(time.time()) + 24 * 3600,
        status=BatchStatus.VALIDATING,
    )
    await services.batches.create(record)
    lines = [InputLine(f"line-{i}", {"model": "m", **BODY}) for i in range(3)]
    record = await batch_queueing.queue_lines(services, record, lines, CALLER)
    assert [line.pending for line in record.lines] == [True] * 3  # none failed
    assert record.waiting_for == "weights_preparing"

    checkpoint = write_servable_dir(tmp_path / "m", mib=1)
    await _weights(
        services, WeightsStatus(WeightsState.READY, path=str(checkpoint), max_model_len=256)
    )
    record = await batch_queueing.queue_lines(services, record, lines, CALLER)
    jobs = await services.jobs.get_many([line.job_id for line in record.lines])
    assert [job.status for job in jobs] == [JobStatus.QUEUED] * 3
    assert await services.redis.zcard(keys.job_queue("m")) == 3


async def test_a_parked_job_fails_at_once_when_its_deployment_is_deleted(services):
    job = await _submit(services)
    assert await services.state.delete_deployment("m")
    assert await parked_jobs.queue_parked(services, job["id"]) == "failed"
    record = await services.jobs.get(job["id"])
    assert record.status is JobStatus.FAILED
    assert record.error.code == "model_not_found", record.error
