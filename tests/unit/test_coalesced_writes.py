"""A connection's writes of one loop turn reach its transport as one write, in order;
closing sends what is pending first, aborting drops it, and a transport the peer closed
is not written to."""

from __future__ import annotations

import asyncio

from ebb.frontdoor.coalesced_writes import CoalescedTransport


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False
        self.events: list[str] = []

    def write(self, data: bytes) -> None:
        assert not self.closing, "written after close"
        self.writes.append(data)
        self.events.append("write")

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True
        self.events.append("close")

    def abort(self) -> None:
        self.closing = True
        self.events.append("abort")

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def _next_turns() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_the_writes_of_one_turn_go_out_as_one():
    async def main() -> FakeTransport:
        fake = FakeTransport()
        coalesced = CoalescedTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
        coalesced.write(b"HTTP/1.1 200 OK\r\n\r\n")
        coalesced.write(b"")
        coalesced.writelines([b"{", b"}"])
        assert fake.writes == [], "nothing is written before the turn ends"
        assert coalesced.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\n\r\n{}")
        await _next_turns()
        coalesced.write(b"next")
        await _next_turns()
        return fake

    fake = asyncio.run(main())
    assert fake.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}", b"next"]


def test_close_sends_what_is_pending_first_and_abort_drops_it():
    async def main() -> tuple[FakeTransport, FakeTransport]:
        loop = asyncio.get_running_loop()
        closed, aborted = FakeTransport(), FakeTransport()
        first = CoalescedTransport(closed, loop)  # type: ignore[arg-type]
        first.write(b"last words")
        first.close()
        second = CoalescedTransport(aborted, loop)  # type: ignore[arg-type]
        second.write(b"dropped")
        second.abort()
        await _next_turns()
        return closed, aborted

    closed, aborted = asyncio.run(main())
    assert (closed.writes, closed.events) == ([b"last words"], ["write", "close"])
    assert (aborted.writes, aborted.events) == ([], ["abort"])


def test_a_transport_closed_by_the_peer_is_not_written_to_and_the_rest_passes_through():
    async def main() -> tuple[FakeTransport, str]:
        fake = FakeTransport()
        coalesced = CoalescedTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
        coalesced.write(b"too late")
        fake.closing = True  # connection_lost before the turn ended
        await _next_turns()
        return fake, coalesced.get_extra_info("peername")

    fake, info = asyncio.run(main())
    assert fake.writes == []
    assert info == "info:peername"
