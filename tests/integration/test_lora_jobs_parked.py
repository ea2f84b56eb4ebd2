"""A job for a LoRA adapter submitted while its base's weights are being prepared is
parked like any job, and queued once they are ready for the base, carrying the adapter and
priced at the adapter's prices (the frontdoor's services in this process, a real Redis;
the test plays the preparer, as tests/integration/test_jobs_parked.py does)."""

from __future__ import annotations

import json

import msgspec
import pytest
from support.weights import write_servable_dir
from test_jobs_parked import BODY, CALLER, _weights, services  # noqa: F401 (a fixture)

from ebb.frontdoor import job_requests, parked_jobs, routes_jobs
from ebb.queue import keys
from ebb.queue.schema import AdapterRef, DeploymentSpec, decode_work
from ebb.queue.weights_status import WeightsState, WeightsStatus

pytestmark = pytest.mark.integration


async def test_a_parked_adapter_job_is_queued_for_its_base_as_the_adapter(
    services,  # noqa: F811 (the fixture imported above)
    tmp_path,
):
    base = await services.state.get_deployment("m")
    adapter = DeploymentSpec(
        name="m-ad",
        source="/adapters/m-ad",
        owner="acme",
        uid="ad-uid",
        base="m",
        base_uid=base.uid,
        price_per_1m_input_tokens_micros=3_000_000,
    )
    assert await services.state.put_deployment(adapter, create_only=True)
    payload = job_requests.JobCreate(model="m-ad", endpoint="completions", body=BODY)
    response = await routes_jobs._submit(payload, CALLER, services, None, None, 0)
    assert response.status_code == 202, response.body
    job_id = json.loads(response.body)["id"]
    assert (await services.jobs.get(job_id)).waiting_for == "weights_preparing"

    checkpoint = write_servable_dir(tmp_path / "m", mib=1)
    ready = WeightsStatus(WeightsState.READY, path=str(checkpoint), max_model_len=256)
    await _weights(services, ready)
    assert await parked_jobs.queue_parked(services, job_id) == "queued"

    record = await services.jobs.get(job_id)
    assert record.deployment == "m-ad"
    queued = await services.redis.zrange(keys.job_queue("m"), 0, -1)
    assert [q.decode() for q in queued] == [record.request_id]
    work = decode_work(await services.redis.hget(keys.request(record.request_id), "work"))
    assert work.deployment == "m" and work.price_per_1m_input_tokens_micros == 3_000_000
    assert work.adapter == AdapterRef(name="m-ad", uid="ad-uid", source="/adapters/m-ad")


async def test_a_parked_adapter_job_fails_once_its_caller_may_no_longer_call_the_base(
    services,  # noqa: F811 (the fixture imported above)
    tmp_path,
):
    base = await services.state.get_deployment("m")
    adapter = DeploymentSpec(
        name="m-ad", source="/adapters/m-ad", owner="acme", uid="ad-uid", base="m",
        base_uid=base.uid, visibility="private",
    )  # fmt: skip
    assert await services.state.put_deployment(adapter, create_only=True)
    payload = job_requests.JobCreate(model="m-ad", endpoint="completions", body=BODY)
    response = await routes_jobs._submit(payload, CALLER, services, None, None, 0)
    assert response.status_code == 202, response.body
    job_id = json.loads(response.body)["id"]

    # While it waits, the base becomes another tenant's, private: acme may not call it.
    taken = msgspec.structs.replace(base, owner="other", visibility="private")
    assert await services.state.put_deployment(taken, create_only=False)
    checkpoint = write_servable_dir(tmp_path / "m", mib=1)
    ready = WeightsStatus(WeightsState.READY, path=str(checkpoint), max_model_len=256)
    await _weights(services, ready)
    assert await parked_jobs.queue_parked(services, job_id) == "failed"

    record = await services.jobs.get(job_id)
    assert record.error.code == "model_not_found", record.error
    assert "no longer one you may call" in record.error.message
    assert await services.redis.zcard(keys.job_queue("m")) == 0
