"""OpenAI's response objects, built from a runner's queue events.

`ResponseBuilder` turns the `Progress` and `Finished` events of one request into OpenAI's
streamed chunks or its single response object, for the live API (frontdoor) and for jobs
(the webhooks collector builds a finished job's result the same way). The names under
which jobs store their endpoint live here too, so both sides agree on them. Nothing here
does I/O, and nothing here imports the frontdoor or the webhooks packages.
"""

from __future__ import annotations

import base64
import logging
import math
import struct
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import msgspec

from ebb.openai.tool_calls import ToolStream, parse_reply
from ebb.queue.schema import ChoiceDelta, Finished, Progress, TokenLogprob, ToolCallFormat

logger = logging.getLogger(__name__)

# OpenAI reports -9999.0 for "very unlikely"; JSON has no -Infinity and engines produce it.
_MIN_LOGPROB = -9999.0
SSE_DONE = b"data: [DONE]\n\n"

# The endpoint a job was submitted for, as its record stores it (and the API shows it).
CHAT_ENDPOINT: Final = "chat.completions"
COMPLETIONS_ENDPOINT: Final = "completions"
EMBEDDINGS_ENDPOINT: Final = "embeddings"


class EndpointKind(StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"

    @property
    def id_prefix(self) -> str:
        return "chatcmpl-" if self is EndpointKind.CHAT else "cmpl-"

    @property
    def response_object(self) -> str:
        return "chat.completion" if self is EndpointKind.CHAT else "text_completion"

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self is EndpointKind.CHAT else "text_completion"

    @classmethod
    def of_job_endpoint(cls, endpoint: str) -> EndpointKind:
        """The kind of a job's stored endpoint (CHAT_ENDPOINT or COMPLETIONS_ENDPOINT)."""
        return cls.CHAT if endpoint == CHAT_ENDPOINT else cls.COMPLETION


def new_request_id(kind: EndpointKind) -> str:
    return f"{kind.id_prefix}{uuid.uuid4().hex}"


def sse_line(obj: Any) -> bytes:
    """One server-sent event carrying `obj` as JSON; end the stream with SSE_DONE."""
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


@dataclass
class _Choice:
    """Everything one choice has produced so far."""

    texts: list[str] = field(default_factory=list)
    chars: int = 0
    logprobs: dict[str, list[Any]] | None = None
    finish_reason: str | None = None
    role_sent: bool = False
    # Streaming with tools: splits the text into content and tool-call deltas.
    tool_stream: ToolStream | None = None


class ResponseBuilder:
    """Assembles one request's OpenAI response from its queue events.

    Feed every `Progress` in order, through `chunks_for` when streaming (which returns the
    SSE chunk objects to send) or `add` otherwise; then, on `Finished`, take
    `final_chunks` (streaming) or `response` (not). Chunks carry one choice each, as
    OpenAI's do; a chat choice's first chunk carries `delta.role`, its last `finish_reason`.
    With `tools` (chat only), the text becomes `tool_calls` as `ebb.openai.tool_calls` parses it,
    and a choice that called tools (auto or required) finishes with "tool_calls".
    """

    def __init__(
        self,
        kind: EndpointKind,
        *,
        request_id: str,
        model: str,
        created_s: int,
        n: int,
        include_usage: bool = False,
        continuous_usage_prompt_tokens: int | None = None,
        logprobs: bool = False,
        tools: ToolCallFormat | None = None,
    ):
        self.kind = kind
        self.tools = tools if kind is EndpointKind.CHAT else None
        self.request_id = request_id
        self.model = model
        self.created_s = created_s
        self.include_usage = include_usage
        # Set (to the prompt's length): every chunk carries the usage so far (vLLM's
        # continuous_usage_stats); the last usage chunk still has the engine's own counts.
        self._continuous_prompt_tokens = continuous_usage_prompt_tokens
        self._completion_tokens = 0
        self.logprobs = logprobs
        self._choices = [_Choice() for _ in range(n)]

    def add(self, progress: Progress) -> None:
        for delta in progress.choices:
            self._record(delta)

    def chunks_for(self, progress: Progress) -> list[dict[str, Any]]:
        chunks = []
        for delta in progress.choices:
            rendered_logprobs = self._record(delta)
            text, calls = self._split_tools(delta.index, delta.text, delta.finish_reason)
            if not (text or calls or rendered_logprobs) and delta.finish_reason is None:
                continue  # nothing a client could see yet
            choice = self._chunk_choice(delta.index, text, rendered_logprobs, calls)
            finish = self._finish_reason(delta.index, delta.finish_reason)
            chunks.append(self._chunk(choice, finish_reason=finish))
        return chunks

    def _split_tools(
        self, index: int, text: str, finish_reason: str | None
    ) -> tuple[str, list[dict[str, Any]]]:
        """A streamed delta's text as (content, tool-call deltas); text alone without tools."""
        if self.tools is None:
            return text, []
        state = self._choices[index]
        if state.tool_stream is None:
            state.tool_stream = ToolStream(self.tools)
        content, calls = state.tool_stream.feed(text)
        if finish_reason is not None:
            more_content, more_calls = state.tool_stream.finish()
            content, calls = content + more_content, calls + more_calls
        return content, calls

    def _finish_reason(self, index: int, reason: str | None) -> str | None:
        stream = self._choices[index].tool_stream
        called = stream is not None and bool(stream.calls)
        if reason == "stop" and called and self.tools is not None and self.tools.mode != "named":
            return "tool_calls"
        return reason

    def final_chunks(self, finished: Finished) -> list[dict[str, Any]]:
        chunks = []
        for index, state in enumerate(self._choices):
            if state.finish_reason is None:
                self._close_unfinished(index, state)
                text, calls = self._split_tools(index, "", "stop")
                choice = self._chunk_choice(index, text, None, calls)
                chunks.append(self._chunk(choice, self._finish_reason(index, "stop")))
        if self.include_usage:
            chunks.append(self._envelope(self.kind.chunk_object, [], usage(finished)))
        return chunks

    def response(self, finished: Finished) -> dict[str, Any]:
        choices = []
        for index, state in enumerate(self._choices):
            if state.finish_reason is None:
                self._close_unfinished(index, state)
            text = "".join(state.texts)
            choice: dict[str, Any] = {"index": index}
            finish_reason = state.finish_reason
            if self.kind is EndpointKind.CHAT:
                choice["message"], finish_reason = self._message(text, finish_reason)
            else:
                choice["text"] = text
            choice["logprobs"] = self._accumulated_logprobs(state)
            choice["finish_reason"] = finish_reason
            choices.append(choice)
        return self._envelope(self.kind.response_object, choices, usage(finished))

    def _message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        if self.tools is None:
            return {"role": "assistant", "content": text}, finish_reason
        content, calls = parse_reply(text, self.tools, cut_off=finish_reason == "length")
        if not calls:
            # Text that holds no call is the answer, except a forced call's guided JSON.
            shown = content if self.tools.mode == "required" else text
            return {"role": "assistant", "content": shown}, finish_reason
        message = {
            "role": "assistant",
            "content": content,
            "tool_calls": [c.to_openai() for c in calls],
        }
        if finish_reason == "stop" and self.tools.mode != "named":
            finish_reason = "tool_calls"
        return message, finish_reason

    def _record(self, delta: ChoiceDelta) -> dict[str, Any] | None:
        """Accumulate a delta; returns its logprobs in the OpenAI format, if any."""
        if not 0 <= delta.index < len(self._choices):
            raise ValueError(
                f"{self.request_id}: choice index {delta.index} outside n={len(self._choices)}"
            )
        state = self._choices[delta.index]
        rendered = None
        if self.logprobs and delta.logprobs:
            rendered = _render_logprobs(self.kind, delta.logprobs, state.chars)
            state.logprobs = _merge_logprobs(state.logprobs, rendered)
        state.texts.append(delta.text)
        state.chars += len(delta.text)
        self._completion_tokens += delta.token_count
        if delta.finish_reason is not None:
            state.finish_reason = delta.finish_reason
        return rendered

    def _close_unfinished(self, index: int, state: _Choice) -> None:
        # The runner owes every choice a finish_reason; clients wait for one, so close it.
        logger.warning(
            "translate: %s choice %d ended without finish_reason", self.request_id, index
        )
        state.finish_reason = "stop"

    def _chunk_choice(
        self,
        index: int,
        text: str,
        logprobs: dict[str, Any] | None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        if self.kind is EndpointKind.CHAT:
            state = self._choices[index]
            delta: dict[str, Any] = {} if state.role_sent else {"role": "assistant"}
            if text or not state.role_sent:
                delta["content"] = text or (None if tool_calls else "")
            if tool_calls:
                delta["tool_calls"] = tool_calls
            state.role_sent = True
            choice["delta"] = delta
        else:
            choice["text"] = text
        choice["logprobs"] = logprobs
        return choice

    def _chunk(self, choice: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        choice["finish_reason"] = finish_reason
        return self._envelope(self.kind.chunk_object, [choice], None)

    def _envelope(
        self, obj: str, choices: list[dict[str, Any]], usage_: dict[str, int] | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.request_id,
            "object": obj,
            "created": self.created_s,
            "model": self.model,
            "choices": choices,
        }
        # Streams with include_usage carry "usage": null on every chunk but the last, as
        # OpenAI's do; other streams carry no usage key; full responses always have it.
        if usage_ is None and self._continuous_prompt_tokens is not None and choices:
            usage_ = usage(Finished(self._continuous_prompt_tokens, self._completion_tokens))
        if usage_ is not None or self.include_usage:
            body["usage"] = usage_
        return body

    def _accumulated_logprobs(self, state: _Choice) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if state.logprobs is not None:
            return state.logprobs
        return _render_logprobs(self.kind, [], state.chars)


def embedding_response(
    vectors: list[list[float]], *, model: str, prompt_tokens: int, encoding_format: str
) -> dict[str, Any]:
    """OpenAI's embeddings list: vector i is input i's. `encoding_format` "base64" writes
    each as little-endian float32 bytes (what the official SDK asks for by default)."""
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _encode(v, encoding_format)}
            for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def embedding_vectors(events: list[Progress], inputs: int) -> list[list[float]] | None:
    """Input i's vector from choice i of an embedding request's events; None if any is
    missing."""
    found: dict[int, list[float]] = {}
    for event in events:
        for choice in event.choices:
            if choice.embedding is not None:
                found[choice.index] = choice.embedding
    if set(found) != set(range(inputs)):
        return None
    return [found[i] for i in range(inputs)]


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def usage(finished: Finished) -> dict[str, int]:
    """OpenAI's usage object, from the engine's own counts (what billing records)."""
    return {
        "prompt_tokens": finished.prompt_tokens,
        "completion_tokens": finished.completion_tokens,
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
    }


def _clamp(logprob: float) -> float:
    return logprob if not math.isnan(logprob) and logprob > _MIN_LOGPROB else _MIN_LOGPROB


def _render_logprobs(
    kind: EndpointKind, tokens: list[TokenLogprob], text_offset: int
) -> dict[str, Any]:
    """One delta's logprobs in the endpoint's format; offsets count from the choice's text."""
    if kind is EndpointKind.CHAT:
        content = [
            {
                "token": t.token,
                "logprob": _clamp(t.logprob),
                "bytes": list(t.bytes),
                "top_logprobs": [
                    {"token": top.token, "logprob": _clamp(top.logprob), "bytes": list(top.bytes)}
                    for top in t.top
                ],
            }
            for t in tokens
        ]
        return {"content": content}
    offsets = []
    for t in tokens:
        offsets.append(text_offset)
        text_offset += len(t.token)
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [_clamp(t.logprob) for t in tokens],
        "top_logprobs": [_top_dict(t) for t in tokens],
        "text_offset": offsets,
    }


def _top_dict(token: TokenLogprob) -> dict[str, float]:
    top: dict[str, float] = {}
    for candidate in token.top:
        # Two candidates may decode to the same string; keep the first (likelier) one.
        top.setdefault(candidate.token, _clamp(candidate.logprob))
    return top


def _merge_logprobs(
    acc: dict[str, list[Any]] | None, new: dict[str, list[Any]]
) -> dict[str, list[Any]]:
    if acc is None:
        return {key: list(values) for key, values in new.items()}
    for key, values in new.items():
        acc[key].extend(values)
    return acc
