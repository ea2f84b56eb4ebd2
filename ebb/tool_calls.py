"""A chat reply's text turned into OpenAI tool calls, whole or while it streams.

The syntaxes are those of vLLM's tool parsers of the same names (without importing vLLM,
which only the runner may): `hermes` (`<tool_call>{"name", "arguments"}</tool_call>`),
`llama3_json` (a reply that is `{"name", "parameters"}` objects joined by `;`, optionally
after `<|python_tag|>`) and `mistral` (`[TOOL_CALLS]` and a JSON array). Forced calls
(`required`, a named function) are produced under guided decoding, so their text is JSON
by construction: an array of {"name", "parameters"}, or the named function's arguments.
Text that does not parse as calls stays content, as in vLLM. Nothing here does I/O.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from ebb.queue.schema import ToolCallFormat

PARSERS = ("hermes", "llama3_json", "mistral")
_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL_TAG = "[TOOL_CALLS]"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of the arguments object
    call_id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def parser_for_template(chat_template: str) -> str:
    """The parser whose syntax a chat template teaches its model; hermes by default."""
    if _MISTRAL_TAG in chat_template:
        return "mistral"
    if _PYTHON_TAG in chat_template:
        return "llama3_json"
    return "hermes"


def parse(text: str, fmt: ToolCallFormat) -> tuple[str | None, list[ToolCall]]:
    """A finished reply as (content, calls); content is None when nothing but calls."""
    if fmt.mode == "named":
        return None, [ToolCall(fmt.function, text.strip())]
    if fmt.mode == "required":
        calls = _array_calls(text, "parameters")
        return (None, calls) if calls is not None else (text, [])
    content, calls = _parse_auto(text, fmt.parser)
    if not fmt.parallel:
        calls = calls[:1]
    return content, calls


def _parse_auto(text: str, parser: str) -> tuple[str | None, list[ToolCall]]:
    if parser == "mistral":
        before, tag, rest = text.partition(_MISTRAL_TAG)
        calls = _array_calls(rest, "arguments") if tag else None
        return (_content(before), calls) if calls else (text, [])
    if parser == "llama3_json":
        calls = _llama3_calls(text)
        return (None, calls) if calls else (text, [])
    return _hermes(text)


def _hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    calls: list[ToolCall] = []
    kept: list[str] = []
    rest = text
    while _HERMES_OPEN in rest:
        before, _, after = rest.partition(_HERMES_OPEN)
        body, closed, rest = after.partition(_HERMES_CLOSE)
        call = _call(_json(body), "arguments")
        if call is None:
            return text, []  # a malformed call: the reply stays text, as vLLM's parser does
        kept.append(before)
        calls.append(call)
        if not closed:
            break  # the reply ended inside the last call (its JSON was whole)
    kept.append(rest)
    return _content("".join(kept)) if calls else text, calls


def _llama3_calls(text: str) -> list[ToolCall]:
    body = text.strip().removeprefix(_PYTHON_TAG).strip()
    decoder, calls, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            value, at = decoder.raw_decode(body, at)
        except ValueError:
            return []
        call = _call(value, "parameters") or _call(value, "arguments")
        if call is None:
            return []
        calls.append(call)
        while at < len(body) and body[at] in "; \n\t":
            at += 1
    return calls


def _array_calls(text: str, arguments_key: str) -> list[ToolCall] | None:
    value = _json(text)
    if not isinstance(value, list) or not value:
        return None
    calls = [_call(item, arguments_key) for item in value]
    return None if any(c is None for c in calls) else [c for c in calls if c is not None]


def _call(value: Any, arguments_key: str) -> ToolCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(arguments_key, {})
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _content(text: str) -> str | None:
    return text.strip() or None


class ToolStream:
    """One streamed choice, split into content to send now and tool-call deltas.

    `feed` each text delta in order, then `finish` once. A named call streams its
    arguments as they come; other calls are sent whole when the reply ends, because only
    then is their JSON known to be complete. Auto mode streams content until the text may
    begin a call, then holds the rest back.
    """

    def __init__(self, fmt: ToolCallFormat):
        self._fmt = fmt
        self._held = ""
        self._holding = fmt.mode == "required"
        self._sent_content = False
        self._named_call: ToolCall | None = None
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        if self._fmt.mode == "named":
            return "", self._named_delta(text)
        if self._holding:
            self._held += text
            return "", []
        pending = self._held + text
        start = self._call_start(pending)
        if start is not None:
            self._holding = True
            self._held = pending[start:]
            return self._send(pending[:start]), []
        keep = _partial_marker_len(pending, self._markers())
        self._held = pending[len(pending) - keep :] if keep else ""
        return self._send(pending[: len(pending) - keep]), []

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        if self._fmt.mode == "named":
            return "", []
        held, self._held = self._held, ""
        if not self._holding:
            return self._send(held), []
        content, calls = parse(held, self._fmt)
        self.calls = calls
        deltas = [{"index": i, **call.to_openai()} for i, call in enumerate(calls)]
        return self._send(content or ""), deltas

    def _named_delta(self, text: str) -> list[dict[str, Any]]:
        if self._named_call is None:
            self._named_call = ToolCall(self._fmt.function, "")
            self.calls = [self._named_call]
            call = self._named_call.to_openai()
            call["function"]["arguments"] = text
            return [{"index": 0, **call}]
        return [{"index": 0, "function": {"arguments": text}}] if text else []

    def _send(self, text: str) -> str:
        self._sent_content = self._sent_content or bool(text.strip())
        return text

    def _markers(self) -> tuple[str, ...]:
        if self._fmt.parser == "mistral":
            return (_MISTRAL_TAG,)
        if self._fmt.parser == "llama3_json":
            return () if self._sent_content else (_PYTHON_TAG,)
        return (_HERMES_OPEN,)

    def _call_start(self, text: str) -> int | None:
        """Where a call may begin in `text`, if it does."""
        if self._fmt.parser == "llama3_json":
            if self._sent_content:
                return None  # llama3_json calls are the whole reply, from its start
            stripped = text.lstrip()
            if stripped.startswith(("{", _PYTHON_TAG)):
                return len(text) - len(stripped)
            return None
        marker = self._markers()[0]
        at = text.find(marker)
        return at if at >= 0 else None


def _partial_marker_len(text: str, markers: tuple[str, ...]) -> int:
    """How many trailing characters of `text` could be the start of a marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:size]):
                longest = max(longest, size)
                break
    return longest


def system_prompt_for_tools(tools: list[dict[str, Any]], parser: str) -> str:
    """Tool instructions for a model whose chat template has no place for tools."""
    specs = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    if parser == "mistral":
        how = f'{_MISTRAL_TAG}[{{"name": <function name>, "arguments": <arguments object>}}]'
    elif parser == "llama3_json":
        how = '{"name": <function name>, "parameters": <arguments object>}'
    else:
        how = f'{_HERMES_OPEN}{{"name": <function name>, "arguments": <arguments object>}}'
        how += _HERMES_CLOSE
    return (
        "You may call functions to help answer. Their JSON schemas:\n"
        f"<tools>\n{specs}\n</tools>\n"
        f"To call a function, reply with exactly:\n{how}"
    )


def render_calls_as_text(calls: list[dict[str, Any]], parser: str) -> str:
    """An assistant turn's calls in `parser`'s syntax, for templates without tool_calls."""
    items = [{"name": c["function"]["name"], **_arguments(c, parser)} for c in calls]
    if parser == "mistral":
        return _MISTRAL_TAG + json.dumps(items, ensure_ascii=False)
    if parser == "llama3_json":
        return "; ".join(json.dumps(i, ensure_ascii=False) for i in items)
    return "\n".join(
        f"{_HERMES_OPEN}{json.dumps(i, ensure_ascii=False)}{_HERMES_CLOSE}" for i in items
    )


def _arguments(call: dict[str, Any], parser: str) -> dict[str, Any]:
    key = "parameters" if parser == "llama3_json" else "arguments"
    parsed = _json(call["function"]["arguments"])
    return {key: parsed if isinstance(parsed, dict) else call["function"]["arguments"]}
