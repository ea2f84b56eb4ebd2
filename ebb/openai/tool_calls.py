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


def parse_reply(
    text: str, fmt: ToolCallFormat, *, cut_off: bool
) -> tuple[str | None, list[ToolCall]]:
    """A whole reply as (content, calls), the same as a stream of it shows. A reply that
    `max_tokens` cut off (`cut_off`) keeps the calls the stream announced, arguments as far
    as they got (as OpenAI answers such a call), where `parse` finds no complete call."""
    content, calls = _forced_or_parsed(text, fmt)
    if calls or not cut_off:
        return content, calls
    stream = ToolStream(fmt)
    sent, _ = stream.feed(text)
    rest, _ = stream.finish()
    return (sent + rest) or None, stream.calls


def _forced_or_parsed(text: str, fmt: ToolCallFormat) -> tuple[str | None, list[ToolCall]]:
    """`parse`, except that a `required` reply is never content: its text is the guided
    decoding's JSON, which a client must not take for an answer (cut off before a call's
    name was complete, it is no call and no content)."""
    content, calls = parse(text, fmt)
    if fmt.mode == "required" and not calls:
        return None, []
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

    `feed` each text delta in order, then `finish` once. Deltas have OpenAI's shape: a
    call's first delta carries `index`, `id`, `type` and `function.name` (with
    `function.arguments` holding what is known of them, possibly ""), later ones
    `index` and a further `function.arguments` piece; the pieces join into the arguments'
    JSON text as the model wrote it. A named call streams its arguments as they come.
    Other calls are found in the text by `_CallScanner` and announced as soon as their
    `name` string is complete, their arguments streamed as the model writes them.

    What stays buffered, and why: auto mode holds text back from where a call may begin
    (a marker, or a prefix of one) until it knows whether it is one; a call's arguments
    that the model writes before its name wait for the name (a delta cannot name its
    function late); hermes text between or after calls is sent as content at the end,
    because until then it may turn out to start another call. When the text never
    produced a call's name, `finish` parses the whole held text as `parse` would (a
    malformed call stays content, as in vLLM). Once a call was announced it cannot be
    taken back: a call whose JSON breaks off (max_tokens) ends with the arguments sent so
    far, as OpenAI's streams do, and a stream after `"parallel_tool_calls": false`
    announces only the first call.
    """

    def __init__(self, fmt: ToolCallFormat):
        self._fmt = fmt
        self._held = ""
        self._holding = fmt.mode == "required"
        self._sent_content = False
        self._named_call: ToolCall | None = None
        self._scanner = _CallScanner(fmt)
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        if self._fmt.mode == "named":
            return "", self._named_delta(text)
        if self._holding:
            self._held += text
            return "", self._scan(text)
        pending = self._held + text
        start = self._call_start(pending)
        if start is not None:
            self._holding = True
            self._held = pending[start:]
            return self._send(pending[:start]), self._scan(self._held)
        keep = _partial_marker_len(pending, self._markers())
        self._held = pending[len(pending) - keep :] if keep else ""
        return self._send(pending[: len(pending) - keep]), []

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        if self._fmt.mode == "named":
            return "", []
        held, self._held = self._held, ""
        if not self._holding:
            return self._send(held), []
        if not self._scanner.calls:
            # No call announced: the held text decides, as a finished reply would.
            content, calls = _forced_or_parsed(held, self._fmt)
            self.calls = calls
            deltas = [{"index": i, **call.to_openai()} for i, call in enumerate(calls)]
            return self._send(content or ""), deltas
        deltas = self._scanner.finish()
        self.calls = [ToolCall(c.name, c.arguments, c.call_id) for c in self._scanner.calls]
        return self._send(self._scanner.content()), deltas

    def _scan(self, text: str) -> list[dict[str, Any]]:
        deltas = self._scanner.feed(text)
        self.calls = [ToolCall(c.name, c.arguments, c.call_id) for c in self._scanner.calls]
        return deltas

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


@dataclass
class _ScannedCall:
    name: str
    call_id: str
    arguments: str = ""  # the arguments text sent so far


class _CallScanner:
    """Finds call objects (`{"name": ..., "arguments" | "parameters": {...}}`) in text fed
    piece by piece, and turns them into OpenAI tool-call deltas as their parts complete.

    A small JSON lexer: it follows strings (with escapes) and brace depth, so it knows the
    keys of a call object (depth 1) and where its arguments object starts and ends. Outside
    call objects, hermes text is tags and content (kept for `content`); the other syntaxes'
    separators (`[`, `,`, `;`, tags) are skipped. In hermes, only a `{` inside
    `<tool_call>` begins a call, so braces in content are content.
    """

    def __init__(self, fmt: ToolCallFormat):
        self._hermes = fmt.mode == "auto" and fmt.parser == "hermes"
        if fmt.mode == "required":
            self._argument_keys: tuple[str, ...] = ("parameters",)
        elif fmt.mode == "auto" and fmt.parser == "llama3_json":
            self._argument_keys = ("parameters", "arguments")
        else:
            self._argument_keys = ("arguments",)
        self._max_calls = 1 if fmt.mode == "auto" and not fmt.parallel else None
        self.calls: list[_ScannedCall] = []
        # Lexer state.
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._string = ""  # the depth-1 string being read (key or value), raw
        self._key = ""
        self._after_colon = False
        # The call object being read: its text so far, name, and where its arguments are.
        self._object = ""
        self._name: str | None = None
        self._arguments_at: int | None = None  # offset of the arguments' `{` in _object
        self._arguments_end: int | None = None
        self._call: _ScannedCall | None = None
        # hermes: text outside calls (content) and whether we are inside <tool_call>.
        self._outside = ""
        self._tag = ""
        self._inside_tag = False

    def feed(self, text: str) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        for char in text:
            if self._depth == 0:
                self._outside_char(char)
                continue
            self._object += char
            self._lex(char, deltas)
        if self._depth > 0:
            self._stream_arguments(deltas)
        return deltas

    def finish(self) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        if self._depth > 0:
            self._stream_arguments(deltas)
        return deltas

    def content(self) -> str:
        return self._outside.strip() if self._hermes else ""

    def _outside_char(self, char: str) -> None:
        if not self._hermes:
            if char == "{":
                self._open_object(char)
            return
        if self._inside_tag:
            if char == "{" and not self._tag.strip():
                self._open_object(char)
                return
            self._tag += char
            if self._tag.endswith(_HERMES_CLOSE):
                self._tag, self._inside_tag = "", False
            return
        self._outside += char
        if self._outside.endswith(_HERMES_OPEN):
            self._outside = self._outside[: -len(_HERMES_OPEN)]
            self._inside_tag, self._tag = True, ""

    def _open_object(self, char: str) -> None:
        self._depth, self._object = 1, char
        self._name = self._call = self._arguments_at = self._arguments_end = None
        self._key, self._after_colon = "", False

    def _lex(self, char: str, deltas: list[dict[str, Any]]) -> None:
        if self._in_string:
            if self._depth == 1:
                self._string += char
            if self._escape:
                self._escape = False
            elif char == "\\":
                self._escape = True
            elif char == '"':
                self._in_string = False
                if self._depth == 1:
                    self._string_done(deltas)
            return
        if char == '"':
            self._in_string = True
            self._string = char if self._depth == 1 else ""
        elif char == ":" and self._depth == 1:
            self._after_colon = True
        elif char == "," and self._depth == 1:
            self._key, self._after_colon = "", False
        elif char in "{[":
            opens_arguments = char == "{" and self._depth == 1 and self._after_colon
            if opens_arguments and self._key in self._argument_keys and self._arguments_at is None:
                self._arguments_at = len(self._object) - 1
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            closes_arguments = self._depth == 1 and self._arguments_at is not None
            if closes_arguments and char == "}" and self._arguments_end is None:
                self._arguments_end = len(self._object)
            if self._depth == 0:
                self._close_object(deltas)

    def _string_done(self, deltas: list[dict[str, Any]]) -> None:
        value = _json(self._string)
        if not self._after_colon:
            self._key = value if isinstance(value, str) else ""
        elif self._key == "name" and isinstance(value, str) and self._name is None:
            self._name = value
            self._announce(deltas)

    def _announce(self, deltas: list[dict[str, Any]]) -> None:
        if self._max_calls is not None and len(self.calls) >= self._max_calls:
            return
        self._call = _ScannedCall(self._name or "", ToolCall("", "").call_id)
        self.calls.append(self._call)
        deltas.append(
            {
                "index": len(self.calls) - 1,
                "id": self._call.call_id,
                "type": "function",
                "function": {"name": self._call.name, "arguments": ""},
            }
        )

    def _stream_arguments(self, deltas: list[dict[str, Any]]) -> None:
        call = self._call
        if call is None or self._arguments_at is None:
            return
        end = self._arguments_end if self._arguments_end is not None else len(self._object)
        known = self._object[self._arguments_at : end]
        piece = known[len(call.arguments) :]
        if piece:
            call.arguments += piece
            index = self.calls.index(call)
            deltas.append({"index": index, "function": {"arguments": piece}})

    def _close_object(self, deltas: list[dict[str, Any]]) -> None:
        self._stream_arguments(deltas)
        call = self._call
        if call is not None and self._arguments_at is None and not call.arguments:
            call.arguments = "{}"  # a call without arguments, as `parse` reads it
            deltas.append({"index": self.calls.index(call), "function": {"arguments": "{}"}})
        self._call = None


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
