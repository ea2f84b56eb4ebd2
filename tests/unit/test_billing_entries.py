"""Booking raw usage into hourly ledger entries: what is billed, where, at which price."""

from __future__ import annotations

import msgspec
import pytest

from ebb.billing.entries import HOUR_MS, book, book_gpu, hour_floor, split_field
from ebb.queue.ledger import RawRecord
from ebb.queue.metering import GpuMeter, GpuSegment, HourClosed
from ebb.queue.schema import UsageRecord

T0 = 1_700_000_000_000 - 1_700_000_000_000 % HOUR_MS  # an hour boundary


def usage(state="finished", prompt=24, completion=7, request_id="chatcmpl-1") -> UsageRecord:
    return UsageRecord(
        request_id=request_id,
        deployment="m",
        tenant="acme",
        prompt_tokens=prompt,
        completion_tokens=completion,
        state=state,
        runner_id="r-1",
        finished_at_s=T0 / 1000,
        key_id="key_1",
        price_per_1m_input_tokens_micros=500_000,
        price_per_1m_output_tokens_micros=1_500_000,
    )


def segment(start_ms: int, end_ms: int, gpus: int = 1, price: int = 1_000) -> GpuSegment:
    meter = GpuMeter(
        runner_id="r-1",
        deployment="m",
        tenant="acme",
        gpu_count=gpus,
        price_per_gpu_second_micros=price,
    )
    return GpuSegment(meter=meter, start_ms=start_ms, end_ms=end_ms)


@pytest.mark.parametrize("state", ["finished", "cancelled"])
def test_finished_and_cancelled_requests_are_billed_in_the_hour_of_their_record(state):
    entry_ms = T0 + 5 * 60_000
    [entry] = book(RawRecord("usage", f"{entry_ms}-3", usage(state)), closed_through_ms=T0)
    assert entry.hour_ms == T0
    assert entry.request_id == "chatcmpl-1"
    assert entry.counts == {
        "requests": 1,
        "prompt_tokens": 24,
        "completion_tokens": 7,
        "token_cost_micros": 23,  # 12 + 10.5, rounded half up once
    }
    assert sorted(entry.increments()) == sorted(
        ("acme|m|" + metric, n) for metric, n in entry.counts.items()
    )
    line = msgspec.json.decode(entry.line())
    assert line["ledger_id"] == f"u:{entry_ms}-3"
    assert line["state"] == state and line["key_id"] == "key_1"
    assert line["cost_micros"] == 23 and line["hour"].endswith(":00:00Z")


def test_a_request_that_failed_while_running_costs_nothing():
    assert book(RawRecord("usage", f"{T0}-0", usage("failed")), T0) == []


def test_a_gpu_segment_is_cut_at_hour_boundaries_and_priced_per_piece():
    seg = segment(T0 - 1_500, T0 + HOUR_MS + 2_501, gpus=2, price=1_000)
    entries = book(RawRecord("gpu", f"{T0 + HOUR_MS + 3_000}-0", seg), T0 - HOUR_MS)
    assert [e.hour_ms for e in entries] == [T0 - HOUR_MS, T0, T0 + HOUR_MS]
    assert [e.counts["gpu_ms"] for e in entries] == [3_000, 2 * HOUR_MS, 5_002]
    assert sum(e.counts["gpu_ms"] for e in entries) == seg.duration_ms * 2
    assert [e.counts["gpu_cost_micros"] for e in entries] == [3_000, 7_200_000, 5_002]
    assert len({e.ledger_id for e in entries}) == 3
    assert all(e.request_id == "" for e in entries)


def test_what_arrives_for_a_closed_hour_is_booked_into_the_oldest_open_one():
    seg = segment(T0 - HOUR_MS, T0 + 1_000)
    entries = book_gpu("1-0", seg, closed_through_ms=T0 + HOUR_MS)
    assert {e.hour_ms for e in entries} == {T0 + HOUR_MS}
    assert sum(e.counts["gpu_ms"] for e in entries) == HOUR_MS + 1_000
    late_usage = book(RawRecord("usage", f"{T0 + 10}-0", usage()), closed_through_ms=T0 + HOUR_MS)
    assert late_usage[0].hour_ms == T0 + HOUR_MS


def test_close_markers_and_undecodable_records_book_nothing():
    assert book(RawRecord("gpu", "1-0", HourClosed(closed_through_ms=T0)), 0) == []
    assert book(RawRecord("gpu", "1-0", None), 0) == []


def test_fields_round_trip():
    assert split_field("acme|(pool)|gpu_ms") == ("acme", "(pool)", "gpu_ms")
    assert hour_floor(T0 + HOUR_MS - 1) == T0
