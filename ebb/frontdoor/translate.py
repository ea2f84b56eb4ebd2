"""Between the OpenAI HTTP API and ebb's queue messages, both ways.

Inbound, `prepare_chat` / `prepare_completion` turn a validated request into the prompt's
token ids and an engine-neutral `SamplingSpec`, refusing with InvalidRequest (400) what the
deployed model cannot do. Outbound, `ResponseBuilder` turns the runner's `Progress` and
`Finished` events into OpenAI's streamed chunks or its single response object. Nothing here
does I/O; the routes own HTTP, the queue and admission.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import msgspec

from ebb.errors import InvalidRequest
from ebb.frontdoor.openai_schema import ChatCompletionRequest, CompletionRequest
from ebb.frontdoor.tokenizer import PromptTokenizer
from ebb.queue.schema import ChoiceDelta, Finished, Progress, SamplingSpec, TokenLogprob

logger = logging.getLogger(__name__)

# OpenAI's documented default for the legacy completions endpoint; chat defaults to the
# rest of the context instead.
COMPLETION_DEFAULT_MAX_TOKENS = 16
# OpenAI reports -9999.0 for "very unlikely"; JSON has no -Infinity and engines produce it.
_MIN_LOGPROB = -9999.0
SSE_DONE = b"data: [DONE]\n\n"


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


def new_request_id(kind: EndpointKind) -> str:
    return f"{kind.id_prefix}{uuid.uuid4().hex}"


def sse_line(obj: Any) -> bytes:
    """One server-sent event carrying `obj` as JSON; end the stream with SSE_DONE."""
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


@dataclass(frozen=True)
class Prepared:
    """A request ready for the queue, plus what the response needs to know about it.

    `logprobs` says whether choices carry logprobs; their format follows `kind`.
    """

    kind: EndpointKind
    model: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec
    stream: bool
    include_usage: bool
    logprobs: bool

    def builder(self, request_id: str, created_s: int) -> ResponseBuilder:
        return ResponseBuilder(
            self.kind,
            request_id=request_id,
            model=self.model,
            created_s=created_s,
            n=self.sampling.n,
            include_usage=self.include_usage,
            logprobs=self.logprobs,
        )


def prepare_chat(
    req: ChatCompletionRequest, tokenizer: PromptTokenizer, *, max_model_len: int, max_n: int
) -> Prepared:
    """Render the conversation with the model's chat template and size the completion."""
    _check_n(req.n, max_n, req.temperature)
    messages = [_template_message(m.role, m.content, m.name) for m in req.messages]
    prompt_ids = tokenizer.render_chat(messages)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return _prepare(
        EndpointKind.CHAT, req, prompt_ids, "messages", logprobs, max_model_len=max_model_len
    )


def prepare_completion(
    req: CompletionRequest, tokenizer: PromptTokenizer, *, max_model_len: int, max_n: int
) -> Prepared:
    """Tokenize the prompt as-is and size the completion."""
    _check_n(req.n, max_n, req.temperature)
    prompt_ids = tokenizer.encode(req.prompt)
    if not prompt_ids:
        raise InvalidRequest("prompt is empty; send at least one character.", param="prompt")
    kind = EndpointKind.COMPLETION
    return _prepare(kind, req, prompt_ids, "prompt", req.logprobs, max_model_len=max_model_len)


def _template_message(role: str, content: str | None, name: str | None) -> dict[str, Any]:
    # Chat templates predate OpenAI's "developer" role and many raise on unknown roles;
    # OpenAI itself treats developer messages as the system prompt.
    message: dict[str, Any] = {"role": "system" if role == "developer" else role}
    message["content"] = content or ""
    if name is not None:
        message["name"] = name
    return message


def _check_n(n: int | None, max_n: int, temperature: float | None) -> None:
    if n is not None and n > max_n:
        raise InvalidRequest(
            f"n must be at most {max_n} on this server; got {n}. Ask for fewer choices.",
            param="n",
        )
    if n is not None and n > 1 and temperature == 0:
        # Greedy sampling would return n identical choices; vLLM refuses it too.
        raise InvalidRequest(
            f"n={n} needs a temperature above 0: greedy sampling gives identical choices. "
            "Raise the temperature or set n to 1.",
            param="n",
        )


def _prepare(
    kind: EndpointKind,
    req: ChatCompletionRequest | CompletionRequest,
    prompt_ids: list[int],
    prompt_param: str,
    logprobs: int | None,
    *,
    max_model_len: int,
) -> Prepared:
    max_tokens = _max_tokens(kind, req, len(prompt_ids), prompt_param, max_model_len)
    fmt = req.response_format
    sampling = SamplingSpec(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        n=req.n or 1,
        stop=list(req.stop or []),
        seed=req.seed,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logprobs=logprobs,
        json_schema=fmt.json_schema.schema_ if fmt and fmt.json_schema else None,
        json_object=fmt is not None and fmt.type == "json_object",
    )
    return Prepared(
        kind=kind,
        model=req.model,
        prompt_token_ids=prompt_ids,
        sampling=sampling,
        stream=bool(req.stream),
        include_usage=req.include_usage,
        logprobs=logprobs is not None,
    )


def _max_tokens(
    kind: EndpointKind,
    req: ChatCompletionRequest | CompletionRequest,
    prompt_len: int,
    prompt_param: str,
    max_model_len: int,
) -> int:
    room = max_model_len - prompt_len
    if room < 1:
        raise InvalidRequest(
            f"This model's maximum context length is {max_model_len} tokens; your prompt has "
            f"{prompt_len} tokens. Shorten the prompt to at most {max_model_len - 1} tokens "
            "so that at least one token can be generated.",
            param=prompt_param,
        )
    requested, param = req.max_tokens_param
    if requested is None:
        return room if kind is EndpointKind.CHAT else min(room, COMPLETION_DEFAULT_MAX_TOKENS)
    if requested > room:
        raise InvalidRequest(
            f"This model's maximum context length is {max_model_len} tokens; your prompt has "
            f"{prompt_len} tokens and {param} asks for {requested} more "
            f"({prompt_len + requested} in total). Set {param} to at most {room}, "
            "or shorten the prompt.",
            param=param,
        )
    return requested


@dataclass
class _Choice:
    """Everything one choice has produced so far."""

    texts: list[str] = field(default_factory=list)
    chars: int = 0
    logprobs: dict[str, list] | None = None
    finish_reason: str | None = None
    role_sent: bool = False


class ResponseBuilder:
    """Assembles one request's OpenAI response from its queue events.

    Feed every `Progress` in order, through `chunks_for` when streaming (which returns the
    SSE chunk objects to send) or `add` otherwise; then, on `Finished`, take
    `final_chunks` (streaming) or `response` (not). Chunks carry one choice each, as
    OpenAI's do; a chat choice's first chunk carries `delta.role`, its last `finish_reason`.
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
        logprobs: bool = False,
    ):
        self.kind = kind
        self.request_id = request_id
        self.model = model
        self.created_s = created_s
        self.include_usage = include_usage
        self.logprobs = logprobs
        self._choices = [_Choice() for _ in range(n)]

    def add(self, progress: Progress) -> None:
        for delta in progress.choices:
            self._record(delta)

    def chunks_for(self, progress: Progress) -> list[dict[str, Any]]:
        chunks = []
        for delta in progress.choices:
            rendered_logprobs = self._record(delta)
            if not delta.text and not rendered_logprobs and delta.finish_reason is None:
                continue  # nothing a client could see yet
            choice = self._chunk_choice(delta.index, delta.text, rendered_logprobs)
            chunks.append(self._chunk(choice, finish_reason=delta.finish_reason))
        return chunks

    def final_chunks(self, finished: Finished) -> list[dict[str, Any]]:
        chunks = []
        for index, state in enumerate(self._choices):
            if state.finish_reason is None:
                self._close_unfinished(index, state)
                chunks.append(self._chunk(self._chunk_choice(index, "", None), "stop"))
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
            if self.kind is EndpointKind.CHAT:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choice["logprobs"] = self._accumulated_logprobs(state)
            choice["finish_reason"] = state.finish_reason
            choices.append(choice)
        return self._envelope(self.kind.response_object, choices, usage(finished))

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
        self, index: int, text: str, logprobs: dict[str, Any] | None
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        if self.kind is EndpointKind.CHAT:
            state = self._choices[index]
            delta: dict[str, Any] = {} if state.role_sent else {"role": "assistant"}
            if text or not state.role_sent:
                delta["content"] = text
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
        if usage_ is not None or self.include_usage:
            body["usage"] = usage_
        return body

    def _accumulated_logprobs(self, state: _Choice) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if state.logprobs is not None:
            return state.logprobs
        return _render_logprobs(self.kind, [], state.chars)


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


def _merge_logprobs(acc: dict[str, list] | None, new: dict[str, list]) -> dict[str, list]:
    if acc is None:
        return {key: list(values) for key, values in new.items()}
    for key, values in new.items():
        acc[key].extend(values)
    return acc
