"""Event ids on server-sent events, for the clients that ask for them: `id: <request id>:<n>`.

`n` counts the events of the request's answer from 0. Rendering a request's events is
deterministic (ebb.queue.stream_views), so any frontdoor replaying them numbers them the
same: a client that lost its connection reconnects with the last id it saw
(`Last-Event-ID`) and gets the events after it, none twice (routes_resume).

Ids are sent only to a client that opts in, with `X-Ebb-Resumable: 1` or a
`Last-Event-ID` header: minimal SSE parsers (vLLM's benchmark client splits on blank
lines and strips only `data: `) fail on any line but `data:` in an event, and no
placement of an `id:` line inside or beside the event escapes them. Without the opt-in
the stream is the bare `data:` events OpenAI sends.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ebb.errors import InvalidRequest

# An event number as a client sends it back: ASCII digits (str.isdigit also takes "²"
# and other scripts' digits, which int() then refuses), bounded (no answer has a
# billion events; a 5,000-digit number is no event's).
MAX_EVENT_NUMBER = 10**9
_NUMBER = re.compile(r"[0-9]{1,10}")
RESUMABLE_HEADER = "x-ebb-resumable"
_YES = frozenset({"1", "true", "yes"})
_NO = frozenset({"0", "false", "no", ""})


def ids_wanted(headers: Mapping[str, str]) -> bool:
    """Whether a request's client asked for event ids (`X-Ebb-Resumable: 1`, or it sent a
    `Last-Event-ID`); InvalidRequest for an `X-Ebb-Resumable` that is neither yes nor no."""
    value = headers.get(RESUMABLE_HEADER)
    if value is not None:
        flag = value.strip().lower()
        if flag in _YES:
            return True
        if flag not in _NO:
            raise InvalidRequest(
                f"X-Ebb-Resumable {value.strip()!r} is not a yes or no; send "
                "`X-Ebb-Resumable: 1` for event ids (to resume the stream), `0` or no header "
                "for none.",
                param="X-Ebb-Resumable",
            )
    return headers.get("last-event-id") is not None


class EventIds:
    """Numbers the SSE events of one request's answer in order, drops those numbered
    `after` or less (the ones a resuming client already has) and, when `stamped`, writes
    each one's id line."""

    def __init__(self, request_id: str, after: int = -1, *, stamped: bool = True):
        self._prefix = b"id: " + request_id.encode() + b":"
        self._next = 0
        self._after = after
        self._stamped = stamped

    def stamp(self, block: bytes) -> bytes:
        """`block` (one or more complete events, each ending in a blank line), with an id
        line on each when stamped; b"" when the client has every one of them already."""
        if not self._stamped and self._next > self._after:
            return block  # the common case: nothing to drop, nothing to add
        kept = []
        for event in block.split(b"\n\n"):
            if not event:
                continue
            n = self._next
            self._next += 1
            if n > self._after:
                line = self._prefix + str(n).encode() + b"\n" if self._stamped else b""
                kept.append(line + event + b"\n\n")
        return b"".join(kept)


def last_event_number(request_id: str, header: str | None) -> int:
    """The `n` of a `Last-Event-ID` header sent to resume `request_id` (-1 without one:
    the whole answer again); InvalidRequest for an id that is not one of its events.
    Read after the caller is known to own `request_id`: a refusal names it."""
    if header is None or not header.strip():
        return -1
    named, _, number = header.strip().rpartition(":")
    if named != request_id or not _NUMBER.fullmatch(number) or int(number) > MAX_EVENT_NUMBER:
        raise InvalidRequest(
            f"Last-Event-ID {header.strip()!r} is not an event of {request_id!r}; send the "
            f'`id:` of the last event you received ("{request_id}:N"), or no header to '
            "receive the answer from its start.",
            param="Last-Event-ID",
        )
    return int(number)


def event_number(text: str | None, *, param: str) -> int | None:
    """A query parameter's event number (`starting_after`), None when absent;
    InvalidRequest naming `param` for anything but ASCII digits up to MAX_EVENT_NUMBER."""
    if text is None:
        return None
    if not _NUMBER.fullmatch(text) or int(text) > MAX_EVENT_NUMBER:
        raise InvalidRequest(
            f"{param} is an event's sequence number: ASCII digits, 0 to {MAX_EVENT_NUMBER}.",
            param=param,
        )
    return int(text)
