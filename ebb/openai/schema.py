"""Request bodies of `POST /v1/chat/completions` and `POST /v1/completions`, validated.

Contract: `parse_chat_request` / `parse_completion_request` take the decoded JSON body (or
the raw bytes) and either return a model whose fields are in range and normalised (content
parts joined into one string, `stop` always a list, `prompt` one string), or raise
`InvalidRequest` whose `param` is the offending field path ("messages.0.content") and
whose message says what to change. Checks that need the deployed model (context length,
the bound on `n`, tokenization) belong to `translate.py`.

Validation is strict (no "5" for 5, no true for 1): a client that sends the wrong JSON type
has a bug it should hear about, and OpenAI refuses the same bodies.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ebb.errors import InvalidRequest
from ebb.openai.sampling_extras import BEAM_ONLY, SamplingExtras
from ebb.openai.tool_fields import ToolCallMessagePart, ToolFields

MAX_STOP_SEQUENCES = 4
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# OpenAI parameters ebb does not implement, with the values that mean "off". Clients and
# SDKs often send these explicitly with their neutral value (and echo back null fields of
# an assistant message they received), so those are accepted and dropped; anything else is
# refused with the reason rather than silently ignored.
_NO_TOOLS = "the deprecated functions API is not supported; use tools and tool_choice"
_CHAT_UNSUPPORTED: dict[str, tuple[str, tuple[Any, ...]]] = {
    "functions": (_NO_TOOLS, (None, [])),
    "function_call": (_NO_TOOLS, (None, "none", "auto")),
    "store": ("stored completions are not supported", (None, False)),
    "metadata": ("stored completions are not supported", (None, {})),
    "service_tier": ("service tiers are not supported", (None, "auto", "default")),
    "modalities": ("only text output is supported", (None, ["text"])),
    "audio": ("only text output is supported", (None,)),
    "prediction": ("predicted outputs are not supported", (None,)),
    "reasoning_effort": ("reasoning models are not supported", (None,)),
    "web_search_options": ("web search is not supported", (None,)),
}
_COMPLETION_UNSUPPORTED: dict[str, tuple[str, tuple[Any, ...]]] = {
    "echo": ("echoing the prompt is not supported", (None, False)),
    "suffix": ("suffix (insertion) is not supported", (None, "")),
    "best_of": ("best_of is not supported; use n", (None, 1)),
}
_MESSAGE_UNSUPPORTED: dict[str, tuple[str, tuple[Any, ...]]] = {
    "function_call": (_NO_TOOLS, (None,)),
    "refusal": ("refusals are not supported", (None,)),
    "annotations": ("annotations are not supported", (None, [])),
    "audio": ("only text is supported", (None,)),
}


# What the published schema says the fields accept: what clients may send, before the
# validators below normalise it (a string or parts joined, a stop string made a list).
_STRING_ARRAY = {"type": "array", "items": {"type": "string"}}
_TEXT_PART = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
    "additionalProperties": False,
}
StopField = Annotated[
    list[str] | None,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {**_STRING_ARRAY, "maxItems": MAX_STOP_SEQUENCES},
                {"type": "null"},
            ]
        }
    ),
]
ContentField = Annotated[
    str | None,
    WithJsonSchema(
        {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}, {"type": "null"}]}
    ),
]
PromptField = Annotated[
    str,
    WithJsonSchema(
        {"anyOf": [{"type": "string"}, {**_STRING_ARRAY, "minItems": 1, "maxItems": 1}]}
    ),
]


def _invalid(message: str, *, at: str | int | None = None) -> PydanticCustomError:
    """A validation error with our own message; `at` extends the field path pydantic knows."""
    return PydanticCustomError("ebb_invalid", "{ebb_message}", {"ebb_message": message, "at": at})


def _is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    # Compare types too: False == 0 and True == 1 would otherwise pass for best_of=1.
    return any(type(value) is type(n) and value == n for n in neutral)


def _drop_neutral(data: Any, unsupported: dict[str, tuple[str, tuple[Any, ...]]]) -> Any:
    if not isinstance(data, dict):
        return data
    kept = dict(data)
    for name, (reason, neutral) in unsupported.items():
        if name not in kept:
            continue
        if not _is_neutral(kept[name], neutral):
            raise _invalid(f"{name} is not supported by this server ({reason}); remove it", at=name)
        del kept[name]
    return kept


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class StreamOptions(_Strict):
    include_usage: bool | None = None
    # vLLM's extension (guidellm sends it): usage so far on every chunk, not only the last.
    continuous_usage_stats: bool | None = None
    # OpenAI pads chunks with random text against length side channels; ebb's chunks
    # carry no padding, which OpenAI's reference makes the client's choice to turn off.
    include_obfuscation: bool | None = None


class JsonSchemaFormat(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    # Aliased because `schema` shadows a (deprecated) BaseModel method.
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _object_schema(self) -> JsonSchemaFormat:
        if self.schema_ is None:
            raise _invalid("response_format.json_schema.schema is required", at="schema")
        # Like OpenAI's structured outputs: the root must describe a JSON object.
        root_type = self.schema_.get("type")
        if root_type != "object":
            raise _invalid(
                'the root of response_format.json_schema.schema must have "type": "object"; '
                f"got {_show(root_type)}. Wrap other values in an object property.",
                at="schema",
            )
        return self


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise _invalid(
                'response_format.json_schema is required when type is "json_schema"',
                at="json_schema",
            )
        if self.type != "json_schema" and self.json_schema is not None:
            raise _invalid(
                f'response_format.json_schema is only allowed with type "json_schema", '
                f"not {self.type!r}",
                at="json_schema",
            )
        return self


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    # Text content parts arrive joined with "\n" (as vLLM joins them); None only for an
    # assistant turn, which OpenAI allows to be empty.
    content: ContentField = None
    name: str | None = None
    # An assistant turn's calls; a tool turn's answer names the call it answers.
    tool_calls: list[ToolCallMessagePart] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _drop_neutral_fields(cls, data: Any) -> Any:
        return _drop_neutral(data, _MESSAGE_UNSUPPORTED)

    @field_validator("role", mode="before")
    @classmethod
    def _known_role(cls, value: Any) -> Any:
        if value == "function":
            raise _invalid(f"messages with role 'function' are not supported ({_NO_TOOLS})")
        return value

    @field_validator("content", mode="before")
    @classmethod
    def _join_text_parts(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise _invalid(
                f"content must be a string or an array of text parts; got {_show(value)}"
            )
        texts = []
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise _invalid(
                    f"content parts of type {_show(kind)} are not supported; "
                    'this model takes text only: {"type": "text", "text": "..."}',
                    at=i,
                )
            if set(part) - {"type", "text"} or not isinstance(part.get("text"), str):
                raise _invalid('a text part must be {"type": "text", "text": "<string>"}', at=i)
            texts.append(part["text"])
        return "\n".join(texts)

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise _invalid(f"content is required in a {self.role!r} message", at="content")
        if self.tool_calls and self.role != "assistant":
            raise _invalid("only assistant messages carry tool_calls", at="tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise _invalid(
                "a 'tool' message needs tool_call_id, the id of the call it answers"
                if self.role == "tool"
                else "only 'tool' messages carry tool_call_id",
                at="tool_call_id",
            )
        return self


class IgnoredHints(_Strict):
    """Fields accepted and ignored, as OpenAI's reference allows a server without their
    meaning to: ebb identifies callers by API key (`user`, `safety_identifier`) and its
    engines cache every shared prompt prefix on their own (`prompt_cache_key`). Chat,
    completions and the Responses API take them alike."""

    user: str | None = None
    safety_identifier: str | None = Field(default=None, max_length=256)
    prompt_cache_key: str | None = Field(default=None, max_length=1024)


class _SamplingRequest(SamplingExtras, IgnoredHints):
    """Fields both endpoints share (vLLM's extras come from SamplingExtras)."""

    _unsupported: ClassVar[dict[str, tuple[str, tuple[Any, ...]]]] = {}

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int | None = Field(default=None, ge=1)
    stop: StopField = None
    seed: int | None = Field(default=None, ge=_INT64_MIN, le=_INT64_MAX)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    response_format: ResponseFormat | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _drop_neutral_fields(cls, data: Any) -> Any:
        return _drop_neutral(_drop_neutral(data, BEAM_ONLY), cls._unsupported)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: Any) -> Any:
        if value is None:  # what SDKs send for "no stop sequences"
            return None
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise _invalid(f"stop must be a string or an array of strings; got {_show(value)}")
        if len(value) > MAX_STOP_SEQUENCES:
            raise _invalid(
                f"stop may hold at most {MAX_STOP_SEQUENCES} sequences; got {len(value)}"
            )
        for i, seq in enumerate(value):
            if isinstance(seq, str) and not seq:
                raise _invalid("stop sequences must not be empty strings", at=i)
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _SamplingRequest:
        if self.stream_options is not None and not self.stream:
            raise _invalid(
                "stream_options is only allowed when stream is true", at="stream_options"
            )
        return self

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk (a non-streamed reply always has usage)."""
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Whether every chunk of a stream carries the usage so far (vLLM's
        `continuous_usage_stats`, which vLLM honours only beside include_usage)."""
        options = self.stream_options
        return self.include_usage and bool(options and options.continuous_usage_stats)


class ChatCompletionRequest(_SamplingRequest, ToolFields):
    _unsupported = _CHAT_UNSUPPORTED

    messages: list[ChatMessage] = Field(min_length=1)
    # For reasoning models' answer length; a model without that control ignores it.
    verbosity: Literal["low", "medium", "high"] | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise _invalid(
                "set only one of max_completion_tokens and max_tokens (its older name)",
                at="max_completion_tokens",
            )
        if self.top_logprobs is not None and not self.logprobs:
            raise _invalid("top_logprobs requires logprobs to be true", at="top_logprobs")
        return self

    @property
    def max_tokens_param(self) -> tuple[int | None, str]:
        """The requested completion budget and the name the caller used for it."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


class CompletionRequest(_SamplingRequest):
    _unsupported = _COMPLETION_UNSUPPORTED

    prompt: PromptField
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_text_prompt(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        if value and all(isinstance(p, str) for p in value):
            if len(value) == 1:
                return value[0]
            raise _invalid(
                f"prompt holds {len(value)} prompts; this server takes one prompt per "
                "request, so send one request per prompt (use n for several completions)"
            )
        if any(isinstance(p, int | list) and not isinstance(p, bool) for p in value):
            raise _invalid("prompt must be a string; token-id prompts are not supported")
        raise _invalid(f"prompt must be a string or a list of one string; got {_show(value)}")

    @property
    def max_tokens_param(self) -> tuple[int | None, str]:
        return self.max_tokens, "max_tokens"


_R = TypeVar("_R", bound=BaseModel)


def parse_chat_request(body: object) -> ChatCompletionRequest:
    """Validate a chat completions body; raises InvalidRequest with `param` set."""
    return _parse(ChatCompletionRequest, body)


def parse_completion_request(body: object) -> CompletionRequest:
    """Validate a (legacy) completions body; raises InvalidRequest with `param` set."""
    return _parse(CompletionRequest, body)


def parse_body(model: type[_R], body: object) -> _R:
    """Validate a body against another endpoint's schema (built from this module's
    `_Strict`-style models) with the same 400s: InvalidRequest naming the field."""
    return _parse(model, body)


def _parse(model: type[_R], body: object) -> _R:
    if isinstance(body, bytes | bytearray | memoryview):
        try:
            body = json.loads(bytes(body))
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidRequest(
                f"The request body is not valid JSON ({e}); send a JSON object."
            ) from e
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON object; got {_json_type(body)}.")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise _to_invalid(e) from e


def _to_invalid(exc: ValidationError) -> InvalidRequest:
    """The first problem, phrased as what to change; one fix at a time keeps it readable."""
    error = exc.errors(include_url=False)[0]
    ctx = error.get("ctx") or {}
    loc = [str(part) for part in error["loc"]]
    if ctx.get("at") is not None:
        loc.append(str(ctx["at"]))
    param = ".".join(loc) or None
    return InvalidRequest(_describe(error, param or "the request body", ctx), param=param)


_KINDS = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "a boolean",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


def _describe(error: Any, param: str, ctx: dict[str, Any]) -> str:
    kind, value = error["type"], error.get("input")
    if kind == "ebb_invalid":
        message: str = ctx["ebb_message"]
        return message
    if kind == "missing":
        return f"Missing required parameter: '{param}'."
    if kind == "extra_forbidden":
        if len(error["loc"]) == 1:
            return f"Unrecognized request argument supplied: {param}"
        parent, _, name = param.rpartition(".")
        return f"Unrecognized field '{name}' in {parent}; remove it."
    if kind in _KINDS:
        return f"{param} must be {_KINDS[kind]}; got {_show(value)}"
    bounds = {
        "greater_than_equal": ("at least", "ge"),
        "greater_than": ("greater than", "gt"),
        "less_than_equal": ("at most", "le"),
        "less_than": ("less than", "lt"),
    }
    if kind in bounds:
        words, key = bounds[kind]
        return f"{param} must be {words} {_show(ctx[key])}; got {_show(value)}"
    if kind == "too_short":
        return f"{param} must not be empty"
    if kind == "string_too_short":
        return f"{param} must not be an empty string"
    if kind in ("too_long", "string_too_long"):
        return f"{param} is too long (at most {ctx['max_length']}); got {ctx.get('actual_length')}"
    if kind == "string_pattern_mismatch":
        return f"{param} must match {ctx['pattern']}; got {_show(value)}"
    if kind == "literal_error":
        return f"{param} must be {ctx['expected']}; got {_show(value)}"
    return f"Invalid value for {param}: {error['msg']}"


def _json_type(value: Any) -> str:
    names = {type(None): "null", bool: "a boolean", int: "an integer", float: "a number"}
    names |= {str: "a string", list: "an array", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    """A short JSON rendering of a rejected value, so the message shows what was sent."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
