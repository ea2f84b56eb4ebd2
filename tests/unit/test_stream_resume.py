"""Resumable streams, without a platform: event ids, `Last-Event-ID` parsing, and the
replay of a request's recorded events across the runs it took."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from ebb.errors import InvalidRequest
from ebb.frontdoor import routes_resume
from ebb.frontdoor.sse_ids import (
    MAX_EVENT_NUMBER,
    EventIds,
    event_number,
    ids_wanted,
    last_event_number,
)
from ebb.queue.schema import ChoiceDelta, Claimed, Failed, Finished, Progress, RequestEvent


def test_each_event_is_numbered_and_those_the_client_has_are_dropped():
    live, resumed = EventIds("chatcmpl-1"), EventIds("chatcmpl-1", after=1)
    blocks = [b"data: a\n\n", b"event: x\ndata: b\n\nevent: y\ndata: c\n\n", b"data: [DONE]\n\n"]
    assert b"".join(live.stamp(b) for b in blocks) == (
        b"id: chatcmpl-1:0\ndata: a\n\n"
        b"id: chatcmpl-1:1\nevent: x\ndata: b\n\n"
        b"id: chatcmpl-1:2\nevent: y\ndata: c\n\n"
        b"id: chatcmpl-1:3\ndata: [DONE]\n\n"
    )
    assert [resumed.stamp(b) for b in blocks] == [
        b"",
        b"id: chatcmpl-1:2\nevent: y\ndata: c\n\n",
        b"id: chatcmpl-1:3\ndata: [DONE]\n\n",
    ]


def test_unstamped_events_pass_bare_and_those_the_client_has_are_still_dropped():
    blocks = [b"data: a\n\n", b"event: x\ndata: b\n\nevent: y\ndata: c\n\n", b"data: [DONE]\n\n"]
    live, resumed = EventIds("r", stamped=False), EventIds("r", after=1, stamped=False)
    assert [live.stamp(b) for b in blocks] == blocks
    assert [resumed.stamp(b) for b in blocks] == [b"", b"event: y\ndata: c\n\n", blocks[2]]


def test_ids_go_only_to_a_client_that_asks_for_them():
    assert not ids_wanted({})
    assert not ids_wanted({"x-ebb-resumable": "0"})
    assert ids_wanted({"x-ebb-resumable": " TRUE "})
    assert ids_wanted({"last-event-id": "r:3"})
    with pytest.raises(InvalidRequest) as refused:
        ids_wanted({"x-ebb-resumable": "maybe"})
    assert refused.value.param == "X-Ebb-Resumable"


def test_last_event_id_names_an_event_of_the_request_being_resumed():
    assert last_event_number("chatcmpl-1", None) == -1
    assert last_event_number("chatcmpl-1", " chatcmpl-1:17 ") == 17
    hostile = ("chatcmpl-1:²", "chatcmpl-1:٣", "chatcmpl-1:" + "9" * 5000, "chatcmpl-1:+3")
    for bad in ("chatcmpl-2:3", "chatcmpl-1:-1", "chatcmpl-1:x", "17", *hostile):
        with pytest.raises(InvalidRequest) as refused:
            last_event_number("chatcmpl-1", bad)
        assert refused.value.param == "Last-Event-ID"


def test_starting_after_is_ascii_digits_within_a_bound():
    assert event_number(None, param="starting_after") is None
    assert event_number("3", param="starting_after") == 3
    for bad in ("²", "٣", "9" * 5000, str(MAX_EVENT_NUMBER + 1), "-1", " 3", "3_0", ""):
        with pytest.raises(InvalidRequest) as refused:
            event_number(bad, param="starting_after")
        assert refused.value.param == "starting_after"


class Reader:
    """An EventReader over a fixed list of events (None once they run out)."""

    def __init__(self, events: list[RequestEvent]):
        self.events = list(events)

    async def next(self, timeout_s: float) -> RequestEvent | None:
        return self.events.pop(0) if self.events else None


def recorded(events: list[RequestEvent], state: str) -> list[RequestEvent]:
    async def request_state(request_id: str) -> dict[str, str]:
        return {"state": state}

    services = SimpleNamespace(queue=SimpleNamespace(request_state=request_state))

    async def collect() -> list[RequestEvent]:
        replay = routes_resume._recorded(services, Reader(events), "chatcmpl-1")  # type: ignore[arg-type]
        return [event async for event in replay]

    return asyncio.run(collect())


def progress(text: str) -> Progress:
    return Progress([ChoiceDelta(index=0, text=text, token_count=1)])


def test_a_failure_followed_by_another_run_is_not_the_end_of_the_replay():
    lost = Failed(message="runner lost", code="runner_lost")
    events: list[RequestEvent] = [
        Claimed("r1"),
        lost,
        Claimed("r2"),
        progress("Paris"),
        Finished(5, 1),
    ]
    assert recorded(events, state="finished") == [progress("Paris"), Finished(5, 1)]
    assert recorded([Claimed("r1"), lost], state="failed") == [lost], "its real end"
