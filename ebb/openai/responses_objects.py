"""OpenAI's Responses API objects, built from a chat completion.

The Responses API is served as a chat completion underneath; `ResponseFrame` holds what a
Response object repeats of its request, and `from_chat_completion` turns the chat answer
into the Response (its output items, status and usage). The streamed events are
`ebb.openai.responses_stream`'s. Nothing here does I/O or imports the frontdoor.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

RESPONSE_ID_PREFIX = "resp_"
# The request fields a Response object repeats.
ECHOED_FIELDS = (
    "instructions",
    "tools",
    "tool_choice",
    "text",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "max_output_tokens",
    "metadata",
    "previous_response_id",
    "store",
    "background",
    "user",
)


def new_response_id() -> str:
    return f"{RESPONSE_ID_PREFIX}{uuid.uuid4().hex}"


def new_item_id(kind: str) -> str:
    """An input item's id: "msg_..." for messages, "fc_..." for the others."""
    return f"{kind}_{uuid.uuid4().hex}"


def output_item_id(kind: str, response_id: str, index: int) -> str:
    """Output item `index` of a response: "msg_"/"fc_", the response's hex, the index.
    An `item_reference` to it names its response (`response_of_item`), so it is found
    with one read, under the caller's tenant."""
    return f"{kind}_{response_id.removeprefix(RESPONSE_ID_PREFIX)}{index:04x}"


_OUTPUT_ITEM_ID = re.compile(r"^(?:msg|fc)_([0-9a-f]{32})[0-9a-f]{4}$")


def response_of_item(item_id: str) -> str | None:
    """The id of the response whose output holds `item_id`; None if it is not an output
    item's id."""
    match = _OUTPUT_ITEM_ID.fullmatch(item_id)
    return RESPONSE_ID_PREFIX + match.group(1) if match else None


@dataclass(frozen=True)
class ResponseFrame:
    """What a Response object shows of its request, fixed when the response is created.

    `echoed` holds the request fields the object repeats (instructions, tools, tool_choice,
    text, temperature, top_p, parallel_tool_calls, max_output_tokens, metadata,
    previous_response_id, store, background), already in the Responses API's shapes."""

    id: str
    model: str
    created_at: int
    echoed: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, response: dict[str, Any]) -> ResponseFrame:
        """The frame of a Response object built before (to rebuild it at a later status)."""
        echoed = {name: response[name] for name in ECHOED_FIELDS if name in response}
        return cls(response["id"], response["model"], response["created_at"], echoed)

    def response(
        self,
        status: str,
        output: list[dict[str, Any]] | None = None,
        *,
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        incomplete_reason: str | None = None,
    ) -> dict[str, Any]:
        """The Response object as of `status` (queued, in_progress, completed, incomplete,
        failed, cancelled)."""
        output = output or []
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": output,
            "output_text": output_text(output),
            "error": error,
            "incomplete_details": (
                {"reason": incomplete_reason} if incomplete_reason is not None else None
            ),
            "usage": usage,
            "instructions": None,
            "tools": [],
            "tool_choice": "auto",
            "text": {"format": {"type": "text"}},
            "temperature": 1.0,
            "top_p": 1.0,
            "parallel_tool_calls": True,
            "max_output_tokens": None,
            "metadata": {},
            "previous_response_id": None,
            "store": True,
            "background": False,
            "truncation": "disabled",
            "reasoning": None,
            "service_tier": "default",
            "user": None,
            **self.echoed,
        }


def output_text(output: list[dict[str, Any]]) -> str:
    """The text of every output_text part, joined: the SDK's `response.output_text`."""
    return "".join(
        part["text"]
        for item in output
        if item.get("type") == "message"
        for part in item.get("content", [])
        if part.get("type") == "output_text"
    )


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [text_part(text)],
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def status_of(finish_reason: str | None) -> tuple[str, str | None]:
    """(status, incomplete reason) of a response whose chat choice finished so."""
    if finish_reason == "length":
        return "incomplete", "max_output_tokens"
    return "completed", None


def responses_usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """The Responses usage object from a chat usage object (the engine's own counts)."""
    if chat_usage is None:
        return None
    input_tokens = chat_usage.get("prompt_tokens", 0)
    output_tokens = chat_usage.get("completion_tokens", 0)
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def from_chat_completion(frame: ResponseFrame, completion: dict[str, Any]) -> dict[str, Any]:
    """The Response for a finished chat completion (its first and only choice): an
    assistant message for the text, a function_call item per tool call."""
    choice = completion["choices"][0]
    status, reason = status_of(choice.get("finish_reason"))
    message = choice["message"]
    output: list[dict[str, Any]] = []
    if message.get("content"):
        item_id = output_item_id("msg", frame.id, len(output))
        output.append(message_item(item_id, message["content"], status))
    for call in message.get("tool_calls") or []:
        function = call["function"]
        item_id = output_item_id("fc", frame.id, len(output))
        output.append(
            function_call_item(item_id, call["id"], function["name"], function["arguments"], status)
        )
    usage = responses_usage(completion.get("usage"))
    return frame.response(status, output, usage=usage, incomplete_reason=reason)
