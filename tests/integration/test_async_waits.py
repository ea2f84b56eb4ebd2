"""Async work waits out transient states (issue 36): a batch line that meets weights
being prepared, or Redis restarting, stays pending and is queued once that passes, within
the completion window; if the window ends first, the line's error names what it waited
for. Permanent conditions (weights that failed) still refuse a line at once."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from ebb.errors import CapacityError, WeightsError
from ebb.frontdoor import batch_queueing, routes_batches
from ebb.frontdoor.batches import InputLine, counts
from ebb.frontdoor.caller import Caller
from ebb.queue.batch_store import BatchRecord, BatchStatus, BatchStore

pytestmark = pytest.mark.integration

CALLER = Caller(tenant="acme", key_id="k1", is_admin=False)
INPUTS = [InputLine(f"line-{i}", {"model": "m", "prompt": "hi"}) for i in range(3)]


class _Deployment:
    """create_job's stand-in: refuses with `refusal` while it is set, then queues."""

    def __init__(self, refusal: Exception | None):
        self.refusal = refusal
        self.queued: list[str] = []

    async def create_job(self, services, caller, job, **kwargs) -> str:
        if self.refusal is not None:
            raise self.refusal
        self.queued.append(kwargs["idempotency"])
        return f"job_{len(self.queued)}"


@pytest.fixture
async def services(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    yield SimpleNamespace(batches=BatchStore(client, retention_s=600, delivery_ttl_s=600))
    await client.aclose()


async def _new_batch(services) -> BatchRecord:
    now = int(time.time())
    record = BatchRecord(
        batch_id=f"batch_{now}",
        tenant="acme",
        endpoint="/v1/completions",
        input_file_id="file_1",
        completion_window="24h",
        created_at_s=now,
        expires_at_s=now + 24 * 3600,
        status=BatchStatus.VALIDATING,
    )
    await services.batches.create(record)
    return record


PREPARING = CapacityError(
    "The weights of 'm' are still being prepared; retry shortly.",
    retry_after_s=5,
    code="weights_preparing",
)


@pytest.mark.parametrize(
    ("refusal", "reason"),
    [(PREPARING, "weights_preparing"), (RedisConnectionError("restarting"), "redis_unavailable")],
)
async def test_lines_wait_out_a_passing_state_then_are_queued(
    services, monkeypatch, refusal, reason
):
    deployment = _Deployment(refusal)
    monkeypatch.setattr(batch_queueing, "create_job", deployment.create_job)
    record = await batch_queueing.queue_lines(services, await _new_batch(services), INPUTS, CALLER)
    assert record.status is BatchStatus.IN_PROGRESS
    assert [line.pending for line in record.lines] == [True] * 3  # none failed
    assert record.waiting_for == reason
    assert counts(record, {})["failed"] == 0

    deployment.refusal = None  # the weights are ready / Redis is back
    record = await batch_queueing.queue_lines(services, record, INPUTS, CALLER)
    assert [line.job_id for line in record.lines] == ["job_1", "job_2", "job_3"]
    assert record.waiting_for == ""


async def test_lines_still_waiting_at_the_window_end_name_what_they_waited_for(
    services, monkeypatch
):
    monkeypatch.setattr(batch_queueing, "create_job", _Deployment(PREPARING).create_job)
    record = await batch_queueing.queue_lines(services, await _new_batch(services), INPUTS, CALLER)

    async def settle(services, record):  # writing the files is not what is tested
        return {}

    monkeypatch.setattr(routes_batches, "_refreshed_view", settle)
    await routes_batches._expire_pending(services, record)
    stored = await services.batches.get(record.batch_id)
    errors = [line.error for line in stored.lines]
    assert all(e is not None and e["code"] == "batch_expired" for e in errors)
    assert all("weights_preparing" in e["message"] for e in errors)


async def test_failed_weights_refuse_the_lines_at_once(services, monkeypatch):
    failed = WeightsError("the checkpoint has no config.json", code="weights_invalid")
    monkeypatch.setattr(batch_queueing, "create_job", _Deployment(failed).create_job)
    batch = await _new_batch(services)
    record = await batch_queueing.queue_lines(services, batch, INPUTS[:1], CALLER)
    assert record.lines[0].error == {
        "code": "weights_invalid",
        "message": "the checkpoint has no config.json",
    }
