"""The Responses API's streamed events, from a chat completion's streamed chunks.

`ResponseEvents` is a small state machine fed the chat.completion.chunk objects of one
request (`ebb.openai.response_builder.ResponseBuilder`'s, with include_usage on) and returning the
Responses events each one makes: `start` (response.created, response.in_progress), then
`feed` per chunk, then `finish` (every open item closed, then response.completed or
response.incomplete) or `fail` (error, response.failed). Text opens an assistant message
item with one output_text part; each tool call opens a function_call item. Every event
carries the next `sequence_number`. `sse` writes one as `event: TYPE` + `data: JSON`.
Nothing here does I/O or imports the frontdoor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from ebb.openai.responses_objects import (
    ResponseFrame,
    function_call_item,
    message_item,
    output_item_id,
    responses_usage,
    status_of,
    text_part,
)


def sse(event: dict[str, Any]) -> bytes:
    """One server-sent event in the Responses API's framing (its type named twice)."""
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(event) + b"\n\n"


@dataclass
class _Item:
    """One output item being streamed: its index in `output` and what it has so far."""

    index: int
    item: dict[str, Any]
    open: bool = True


class ResponseEvents:
    def __init__(self, frame: ResponseFrame):
        self.frame = frame
        self._sequence = 0
        self._items: list[_Item] = []
        self._message: _Item | None = None  # the assistant message text goes to
        self._calls: dict[int, _Item] = {}  # by the chat delta's tool call index
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self.response: dict[str, Any] | None = None  # the final object, once finished

    def start(self) -> list[dict[str, Any]]:
        snapshot = self.frame.response("in_progress")
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events of one chat chunk (a usage-only chunk makes none)."""
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        events: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call(call)
            if choice.get("finish_reason") is not None:
                self._finish_reason = choice["finish_reason"]
        return events

    def finish(self) -> list[dict[str, Any]]:
        """Every open item closed, then the response's final event."""
        status, reason = status_of(self._finish_reason)
        events = self._close_all(status)
        self.response = self.frame.response(
            status,
            [i.item for i in self._items],
            usage=responses_usage(self._usage),
            incomplete_reason=reason,
        )
        final = "response.completed" if status == "completed" else "response.incomplete"
        return [*events, self._event(final, response=self.response)]

    def fail(self, error: dict[str, Any]) -> list[dict[str, Any]]:
        """An error event and response.failed (`error`: OpenAI's {"error": {...}} body)."""
        body = error.get("error", error)
        events = self._close_all("incomplete")
        details = {"code": body.get("code") or "server_error", "message": body.get("message", "")}
        self.response = self.frame.response(
            "failed",
            [i.item for i in self._items],
            usage=responses_usage(self._usage),
            error=details,
        )
        return [
            *events,
            self._event(
                "error", code=body.get("code"), message=details["message"], param=body.get("param")
            ),
            self._event("response.failed", response=self.response),
        ]

    def _text(self, text: str) -> list[dict[str, Any]]:
        events = []
        if self._message is None:
            item_id = output_item_id("msg", self.frame.id, len(self._items))
            self._message = self._add(message_item(item_id, "", "in_progress"))
            self._message.item["content"] = []
            events.append(self._added(self._message))
            self._message.item["content"].append(text_part(""))
            events.append(self._part("response.content_part.added", self._message))
        message = self._message
        message.item["content"][0]["text"] += text
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=message.item["id"],
                output_index=message.index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return events

    def _call(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        events = []
        function = delta.get("function") or {}
        call = self._calls.get(delta.get("index", 0))
        if call is None:
            events += self._close_message("completed")  # text comes before calls
            item = function_call_item(
                output_item_id("fc", self.frame.id, len(self._items)),
                delta.get("id") or "",
                function.get("name") or "",
                "",
                "in_progress",
            )
            call = self._calls[delta.get("index", 0)] = self._add(item)
            events.append(self._added(call))
        if function.get("arguments"):
            call.item["arguments"] += function["arguments"]
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=call.item["id"],
                    output_index=call.index,
                    delta=function["arguments"],
                )
            )
        return events

    def _close_all(self, status: str) -> list[dict[str, Any]]:
        events = self._close_message(status)
        for call in self._calls.values():
            if call.open:
                call.open = False
                call.item["status"] = status
                events.append(
                    self._event(
                        "response.function_call_arguments.done",
                        item_id=call.item["id"],
                        output_index=call.index,
                        name=call.item["name"],
                        arguments=call.item["arguments"],
                    )
                )
                events.append(self._done(call))
        return events

    def _close_message(self, status: str) -> list[dict[str, Any]]:
        message = self._message
        if message is None or not message.open:
            return []
        message.open = False
        message.item["status"] = status
        part = message.item["content"][0]
        return [
            self._event(
                "response.output_text.done",
                item_id=message.item["id"],
                output_index=message.index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            ),
            self._part("response.content_part.done", message),
            self._done(message),
        ]

    def _add(self, item: dict[str, Any]) -> _Item:
        entry = _Item(len(self._items), item)
        self._items.append(entry)
        return entry

    def _added(self, entry: _Item) -> dict[str, Any]:
        return self._event(
            "response.output_item.added", output_index=entry.index, item=_copy(entry.item)
        )

    def _done(self, entry: _Item) -> dict[str, Any]:
        return self._event(
            "response.output_item.done", output_index=entry.index, item=_copy(entry.item)
        )

    def _part(self, kind: str, message: _Item) -> dict[str, Any]:
        return self._event(
            kind,
            item_id=message.item["id"],
            output_index=message.index,
            content_index=0,
            part=dict(message.item["content"][0]),
        )

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """The item as of now (an event must not change when the item grows later)."""
    copied = dict(item)
    if "content" in copied:
        copied["content"] = [dict(part) for part in copied["content"]]
    return copied
