"""The billing ledger on a real Redis and moto's S3 server: folding exactly once (also with
two consumers at once), closing hours, late GPU time, reconcile, and the hourly export
written exactly once per hour file across a crash and a restart."""

from __future__ import annotations

import asyncio
import os

import boto3
import msgspec
import pytest
import redis.asyncio as aioredis

from ebb.billing.consumer import LedgerConsumer
from ebb.billing.entries import HOUR_MS, hour_floor
from ebb.billing.export import S3HourExporter
from ebb.billing.reconcile import reconcile, sum_lines
from ebb.billing.usage import with_unfolded
from ebb.queue import keys
from ebb.queue.ledger import LedgerStore
from ebb.queue.metering import GpuMeter
from ebb.queue.schema import UsageRecord

pytestmark = pytest.mark.integration


@pytest.fixture
async def client(redis_url):
    c = aioredis.Redis.from_url(redis_url)
    yield c
    await c.aclose()


@pytest.fixture
async def now_hour(client) -> int:
    """The start of the current hour on Redis's clock. The hour may turn during a test:
    assertions about which hours closed read the ledger's state rather than assume."""
    return hour_floor(await LedgerStore(client).redis_now_ms())


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ.setdefault(name, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_endpoint, request):
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    name = "ebb-ledger-" + request.node.name.replace("_", "-")[:40].lower()
    s3.create_bucket(Bucket=name)
    # Versioning shows every write: "exactly once" means exactly one version per file.
    s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return s3, name


def usage(request_id: str, tenant="acme", prompt=10, completion=5, state="finished") -> bytes:
    return msgspec.json.encode(
        UsageRecord(
            request_id=request_id,
            deployment="m",
            tenant=tenant,
            prompt_tokens=prompt,
            completion_tokens=completion,
            state=state,
            runner_id="r-1",
            finished_at_s=0.0,
            price_per_1m_input_tokens_micros=1_000_000,
            price_per_1m_output_tokens_micros=3_000_000,
        )
    )


async def add_usage(client, at_ms: int, request_id: str, **fields) -> None:
    # Explicit past ids stand in for records written hours ago (stream ids are Redis time).
    await client.xadd(keys.USAGE, {"r": usage(request_id, **fields)}, id=f"{at_ms}-*")


async def add_gpu(client, start_ms: int, end_ms: int, at_ms: int | None = None) -> None:
    meter = GpuMeter(runner_id="r-1", deployment="m", tenant="acme", price_per_gpu_second_micros=2)
    fields = {"g": msgspec.json.encode(meter), "s": start_ms, "e": end_ms}
    await client.xadd(keys.GPU_USAGE, fields, id=f"{at_ms}-*" if at_ms else "*")


def totals(aggregates: dict[int, dict[str, int]]) -> dict[str, int]:
    result: dict[str, int] = {}
    for counts in aggregates.values():
        for name, n in counts.items():
            result[name] = result.get(name, 0) + n
    return result


async def test_two_consumers_at_once_fold_every_record_exactly_once(client, redis_url, now_hour):
    for i in range(300):
        await add_usage(client, now_hour + i, f"req-{i}", tenant=f"t{i % 3}", completion=i)
    await add_gpu(client, now_hour, now_hour + 7_000)
    other = aioredis.Redis.from_url(redis_url)
    try:
        consumers = [LedgerConsumer(LedgerStore(c), grace_s=3600, batch=7) for c in (client, other)]
        await asyncio.gather(*(c.drain() for c in consumers))
    finally:
        await other.aclose()
    store = LedgerStore(client)
    folded = totals(await store.aggregates())
    for t in range(3):
        mine = [i for i in range(300) if i % 3 == t]
        assert folded[f"t{t}|m|requests"] == len(mine)
        assert folded[f"t{t}|m|prompt_tokens"] == 10 * len(mine)
        assert folded[f"t{t}|m|completion_tokens"] == sum(mine)
        assert folded[f"t{t}|m|token_cost_micros"] == sum(
            (10 * 1_000_000 + i * 3_000_000 + 500_000) // 1_000_000 for i in mine
        )
    assert folded["acme|m|gpu_ms"] == 7_000 and folded["acme|m|gpu_cost_micros"] == 14
    result = await reconcile(store)
    assert result.ok and result.records == 301 and result.entries == 301


async def test_a_request_id_recorded_twice_is_billed_once(client, now_hour):
    await add_usage(client, now_hour + 1, "req-dup", completion=5)
    await add_usage(client, now_hour + 2, "req-dup", completion=5)
    await add_usage(client, now_hour + 3, "req-failed", completion=9, state="failed")
    store = LedgerStore(client)
    await LedgerConsumer(store, grace_s=3600).drain()
    folded = totals(await store.aggregates())
    assert folded["acme|m|requests"] == 1 and folded["acme|m|completion_tokens"] == 5
    result = await reconcile(store)
    assert result.ok and result.duplicate_request_ids == ["req-dup"]


async def test_a_view_counts_what_is_not_folded_yet_as_the_consumer_will(client, now_hour):
    old = now_hour - 2 * HOUR_MS
    await add_usage(client, old + 1, "req-1", completion=3)
    store = LedgerStore(client)
    consumer = LedgerConsumer(store, grace_s=0)
    await consumer.drain()  # closes every hour before this one
    await add_usage(client, now_hour + 5, "req-2", completion=4)
    await add_usage(client, now_hour + 6, "req-2", completion=4)  # recorded twice
    await add_gpu(client, old + 1_000, now_hour + 1_000)  # late: the closed part books now
    before = await store.view(tail_limit=100)
    assert len(before.tail) == 3 and before.tail_complete
    await consumer.drain()
    after = await store.view(tail_limit=100)
    assert after.tail == []
    assert with_unfolded(before) == after.aggregates


async def test_reconcile_finds_drift(client, now_hour):
    await add_usage(client, now_hour + 1, "req-1")
    store = LedgerStore(client)
    await LedgerConsumer(store, grace_s=3600).drain()
    assert (await reconcile(store)).ok
    await client.hincrby(keys.ledger_aggregates(now_hour), "acme|m|completion_tokens", 1)
    result = await reconcile(store)
    assert not result.ok
    [drift] = result.drift
    assert (drift.field, drift.stored, drift.recomputed) == ("acme|m|completion_tokens", 6, 5)


async def test_a_fold_computed_from_a_stale_state_is_refused(client, now_hour):
    await add_usage(client, now_hour + 1, "req-1")
    store = LedgerStore(client)
    consumer = LedgerConsumer(store, grace_s=3600)
    await consumer.drain()
    stale = await store.state()
    await add_usage(client, now_hour + 2, "req-2")
    await consumer.drain()
    outcome = await store.fold(stale, "9-9", stale.gpu_cursor, b"[]")
    assert not outcome.applied
    assert totals(await store.aggregates())["acme|m|requests"] == 2


async def test_hours_close_and_late_gpu_time_books_into_the_open_hour(client, now_hour):
    old = now_hour - 3 * HOUR_MS
    await add_usage(client, old + 10, "req-old", completion=4)
    await add_usage(client, old + HOUR_MS + 10, "req-later", completion=6)
    await add_gpu(client, old + 1_000, old + 3_000, at_ms=old + 3_000)
    store = LedgerStore(client)
    consumer = LedgerConsumer(store, grace_s=0)
    await consumer.drain()
    state = await store.state()
    assert state.closed_through_ms >= now_hour, "every past hour is closed"
    before = await store.aggregates()
    assert before[old]["acme|m|gpu_ms"] == 2_000
    # A runner SIGKILLed three hours ago, closed only now: its time lands in the open hour.
    await add_gpu(client, old + 5_000, old + 9_000)
    await consumer.drain()
    after = await store.aggregates()
    assert after[old] == before[old], "a closed hour never changes"
    open_hour = (await store.state()).closed_through_ms
    assert after[open_hour]["acme|m|gpu_ms"] == 4_000
    result = await reconcile(store)
    assert result.ok, result.drift


class CrashAfterWrite(S3HourExporter):
    """Writes the file, then dies before the hour is marked exported."""

    def export(self, hour_ms, lines):
        super().export(hour_ms, lines)
        raise RuntimeError("killed after the PUT")


async def test_hour_files_are_exported_exactly_once_across_a_crash_and_a_restart(
    client, bucket, s3_endpoint, now_hour
):
    s3, name = bucket
    old = now_hour - 3 * HOUR_MS
    for i in range(5):
        await add_usage(client, old + i, f"req-a{i}", completion=i + 1)
    await add_usage(client, old + HOUR_MS + 1, "req-b", completion=9)
    await add_gpu(client, old + HOUR_MS + 100, old + 2 * HOUR_MS + 100, at_ms=old + 2 * HOUR_MS)
    store = LedgerStore(client)
    crashing = CrashAfterWrite(name, "usage", endpoint_url=s3_endpoint)
    await LedgerConsumer(store, crashing, grace_s=0).drain()
    assert len(await store.pending_exports()) == 3, "the crash left every hour pending"
    exporter = S3HourExporter(name, "usage", endpoint_url=s3_endpoint)
    await LedgerConsumer(store, exporter, grace_s=0).drain()  # the restart
    assert await store.pending_exports() == []
    hours = list(range(old, (await store.state()).closed_through_ms, HOUR_MS))
    assert len(hours) >= 3
    versions = s3.list_object_versions(Bucket=name)["Versions"]
    assert sorted(v["Key"] for v in versions) == sorted(exporter.object_key(h) for h in hours)
    aggregates = await store.aggregates()
    for hour in hours:
        body = exporter.fetch(hour)
        assert sum_lines(body.splitlines()) == aggregates.get(hour, {})
    assert len(exporter.fetch(old).splitlines()) == 5
    result = await reconcile(store, exporter)
    assert result.ok and result.exported_hours_checked == len(hours)


async def test_an_hour_file_with_other_content_is_never_overwritten(
    client, bucket, s3_endpoint, now_hour
):
    s3, name = bucket
    old = now_hour - HOUR_MS
    await add_usage(client, old + 1, "req-1")
    exporter = S3HourExporter(name, "usage", endpoint_url=s3_endpoint)
    s3.put_object(Bucket=name, Key=exporter.object_key(old), Body=b"someone else's\n")
    store = LedgerStore(client)
    await LedgerConsumer(store, exporter, grace_s=0).drain()
    assert (await store.pending_exports())[0] == old
    assert exporter.fetch(old) == b"someone else's\n"


async def test_raw_token_records_are_trimmed_once_closed_and_exported(
    client, bucket, s3_endpoint, now_hour
):
    _, name = bucket
    old = now_hour - 3 * HOUR_MS
    for i in range(4):
        await add_usage(client, old + i, f"req-old{i}", completion=i + 1)
    await add_usage(client, now_hour + 1, "req-now", completion=7)
    store = LedgerStore(client)
    exporter = S3HourExporter(name, "usage", endpoint_url=s3_endpoint)
    # Within the retention nothing goes, though the hours are closed and exported.
    await LedgerConsumer(store, exporter, grace_s=0).drain()
    assert await client.xlen(keys.USAGE) == 5 and await store.usage_trimmed_ms() < old
    await LedgerConsumer(store, exporter, grace_s=0, usage_retention_s=0).drain()
    closed = (await store.state()).closed_through_ms
    assert await store.usage_trimmed_ms() == closed
    assert await client.xlen(keys.USAGE) == 1  # the open hour's record stays
    result = await reconcile(store, exporter)
    assert result.ok, result.drift
    assert result.trimmed_before and result.exported_hours_checked >= 3
    # Drift in a trimmed hour still shows, against its exported file.
    await client.hincrby(keys.ledger_aggregates(old), "acme|m|completion_tokens", 1)
    drift = (await reconcile(store, exporter)).drift
    assert [(d.field, d.where) for d in drift] == [("acme|m|completion_tokens", "s3")]


async def test_hours_waiting_for_export_keep_their_raw_records(
    client, bucket, s3_endpoint, now_hour
):
    _, name = bucket
    old = now_hour - 2 * HOUR_MS
    await add_usage(client, old + 1, "req-1", completion=3)
    await add_usage(client, now_hour + 1, "req-2", completion=3)
    store = LedgerStore(client)
    crashing = CrashAfterWrite(name, "usage", endpoint_url=s3_endpoint)
    await LedgerConsumer(store, crashing, grace_s=0, usage_retention_s=0).drain()
    assert await store.pending_exports()
    assert await client.xlen(keys.USAGE) == 2 and await store.usage_trimmed_ms() <= old
    assert (await reconcile(store)).ok
