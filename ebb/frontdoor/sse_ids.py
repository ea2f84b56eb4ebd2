"""Every server-sent event a frontdoor streams carries `id: <request id>:<n>`.

`n` counts the events of the request's answer from 0. Rendering a request's events is
deterministic (ebb.queue.stream_views), so any frontdoor replaying them numbers them the
same: a client that lost its connection reconnects with the last id it saw
(`Last-Event-ID`) and gets the events after it, none twice (routes_resume).
"""

from __future__ import annotations

from ebb.errors import InvalidRequest


class EventIds:
    """Stamps the SSE events of one request's answer with their ids, in order, and drops
    those numbered `after` or less (the ones a resuming client already has)."""

    def __init__(self, request_id: str, after: int = -1):
        self._prefix = b"id: " + request_id.encode() + b":"
        self._next = 0
        self._after = after

    def stamp(self, block: bytes) -> bytes:
        """`block` (one or more complete events, each ending in a blank line) with an id
        line on each; b"" when the client has every one of them already."""
        stamped = []
        for event in block.split(b"\n\n"):
            if not event:
                continue
            n = self._next
            self._next += 1
            if n > self._after:
                stamped.append(self._prefix + str(n).encode() + b"\n" + event + b"\n\n")
        return b"".join(stamped)


def last_event_number(request_id: str, header: str | None) -> int:
    """The `n` of a `Last-Event-ID` header sent to resume `request_id` (-1 without one:
    the whole answer again); InvalidRequest for an id that is not one of its events."""
    if header is None or not header.strip():
        return -1
    named, _, number = header.strip().rpartition(":")
    if named != request_id or not number.isdigit():
        raise InvalidRequest(
            f"Last-Event-ID {header.strip()!r} is not an event of {request_id!r}; send the "
            f'`id:` of the last event you received ("{request_id}:N"), or no header to '
            "receive the answer from its start.",
            param="Last-Event-ID",
        )
    return int(number)
