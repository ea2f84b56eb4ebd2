"""From a Responses API request to the chat completions request that serves it.

The Responses API runs as a chat completion: `chat_body` writes the chat request body
(messages from `instructions`, the earlier turns' items and the new input items; the
function tools, tool_choice, text.format and sampling fields under their chat names),
which then takes the chat path unchanged (parse, tokenize, queue, bill). Items are the
Responses API's dicts, as stored (`ResponseStore`) and as `GET .../input_items` shows
them (text parts keep only their type and text: what the model sees): a message becomes
a message, `function_call` items become the `tool_calls` of an
assistant message and `function_call_output` items become `role: tool` messages.
`in_responses_terms` renames the chat fields a refusal names back to the ones the
caller sent. Nothing here does I/O.
"""

from __future__ import annotations

import re
from typing import Any

from ebb.errors import InvalidRequest
from ebb.openai.responses_objects import new_item_id
from ebb.openai.responses_schema import ResponsesRequest

# Chat field -> the Responses field the caller set it with (longest names first).
_RENAMED = (
    ("max_completion_tokens", "max_output_tokens"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("messages", "input"),
)


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as items in the shape OpenAI lists them (each with an id; a
    message's text as parts; a string input is one user message)."""
    if isinstance(req.input, str):
        items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": req.input}]
    else:
        items = [
            item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in req.input
        ]
    for item in items:
        if "id" not in item:
            item["id"] = new_item_id("msg" if item["type"] == "message" else "fc")
        if item["type"] == "item_reference":
            continue  # replaced by the item it names (routes_responses)
        if item["type"] == "message" and isinstance(item["content"], str):
            kind = "output_text" if item["role"] == "assistant" else "input_text"
            item["content"] = [{"type": kind, "text": item["content"]}]
        for field in ("content", "output"):
            if isinstance(item.get(field), list):
                item[field] = [_seen_part(part) for part in item[field]]
        item.setdefault("status", "completed")
    return items


def _seen_part(part: dict[str, Any]) -> dict[str, Any]:
    """A text part as kept: what the model sees (its type and text). An echoed
    output_text's annotations and logprobs are never tokenised, so never stored."""
    return {"type": part["type"], "text": part["text"]}


def chat_body(
    req: ResponsesRequest, context: list[dict[str, Any]], items: list[dict[str, Any]]
) -> dict[str, Any]:
    """The chat completions body for `req`, continuing the conversation `context`."""
    messages = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages += to_messages([*context, *items])
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    if req.tools:
        body["tools"] = [
            {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
            for tool in req.tools
        ]
    choice = req.tool_choice
    if choice is not None:
        body["tool_choice"] = (
            choice
            if isinstance(choice, str)
            else {"type": "function", "function": {"name": choice.name}}
        )
    fmt = req.text.format if req.text else None
    if fmt is not None and fmt.type != "text":
        body["response_format"] = {"type": fmt.type}
        if fmt.type == "json_schema":
            schema = fmt.model_dump(by_alias=True, exclude={"type"}, exclude_none=True)
            body["response_format"]["json_schema"] = schema
    fields = {
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "parallel_tool_calls": req.parallel_tool_calls,
    }
    body.update({name: value for name, value in fields.items() if value is not None})
    if req.stream:
        # The final event carries the usage, so the chat stream must end with it.
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages from Responses items, in order; consecutive function calls (and the
    assistant text just before them) make one assistant message."""
    messages: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item["role"], "content": _text(item["content"])})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"])}
            )
    return messages


def _text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content)


def echoed_fields(req: ResponsesRequest) -> dict[str, Any]:
    """What the Response object repeats of its request, in the Responses API's shapes."""
    choice = req.tool_choice
    return {
        "instructions": req.instructions,
        "tools": [tool.model_dump(exclude_none=True) for tool in req.tools or []],
        "tool_choice": (
            choice.model_dump() if choice is not None and not isinstance(choice, str) else choice
        )
        or "auto",
        "text": {
            "format": (
                req.text.format.model_dump(by_alias=True, exclude_none=True)
                if req.text and req.text.format
                else {"type": "text"}
            )
        },
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "previous_response_id": req.previous_response_id,
        "store": req.stored,
        "background": bool(req.background),
        "user": req.user,
    }


def in_responses_terms(error: InvalidRequest) -> InvalidRequest:
    """`error` (from the chat path) naming the Responses fields the caller sent."""
    for chat, responses in _RENAMED:
        error.message = re.sub(rf"\b{re.escape(chat)}\b", responses, error.message)
        if error.param and (error.param == chat or error.param.startswith(chat + ".")):
            error.param = responses + error.param[len(chat) :]
    if error.param and error.param.startswith("tools."):
        error.param = error.param.replace(".function.", ".", 1)
    return error
