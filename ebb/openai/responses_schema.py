"""Request body of `POST /v1/responses` (OpenAI's Responses API), validated.

Contract: `parse_responses_request` takes the decoded JSON body and returns a
`ResponsesRequest`, or raises InvalidRequest naming the offending field ("input.2.type")
with what to change. Validation is strict as for chat (schema.py): unknown fields
are refused by name. Supported: text input (a string, or message, function_call,
function_call_output and item_reference items), `instructions`, function tools,
`tool_choice`, `text.format` (text, json_object, json_schema), `max_output_tokens`,
sampling, `metadata`, `store`, `previous_response_id`, `stream` and `background`. What
the server cannot do (hosted tools, images and files, reasoning, truncation "auto") is
refused with the reason unless sent with its neutral value, as SDKs do.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ebb.errors import InvalidRequest
from ebb.openai.schema import (
    IgnoredHints,
    _describe,
    _drop_neutral,
    _show,
    parse_body,
)
from ebb.openai.tool_fields import FUNCTION_NAME_PATTERN, MAX_TOOLS

MAX_METADATA_KEYS = 16
# Bounds on what a stored response and a stream view keep but the model never reads as
# tokens (ids, the text.format description and schema, `user`): a tenant cannot make a
# record large without paying for its prompt.
MAX_ID_CHARS = 256
MAX_FORMAT_DESCRIPTION_CHARS = 8192
MAX_FORMAT_SCHEMA_BYTES = 256 * 1024
ItemId = Annotated[str, StringConstraints(max_length=MAX_ID_CHARS)]
RESPONSE_ID_PATTERN = r"^resp_[0-9a-f]{32}$"

_UNSUPPORTED: dict[str, tuple[str, tuple[Any, ...]]] = {
    "truncation": (
        'only truncation "disabled" is supported; shorten the input',
        (None, "disabled"),
    ),
    "include": ("no extra output data can be included", (None, [])),
    "reasoning": ("reasoning models are not supported", (None, {})),
    "service_tier": ("service tiers are not supported", (None, "auto", "default")),
    "top_logprobs": ("logprobs are not supported on /v1/responses; use chat", (None, 0)),
    "max_tool_calls": ("max_tool_calls is not supported", (None,)),
    "conversation": ("conversations are not supported; use previous_response_id", (None,)),
    "prompt": ("stored prompt templates are not supported", (None,)),
    "prompt_cache_retention": ("prompt cache retention is not configurable", (None,)),
}
_ITEM_TYPES = ("message", "function_call", "function_call_output", "item_reference")
_PART_TYPES = ("input_text", "output_text")


def _invalid(message: str, *, at: str | int | None = None) -> PydanticCustomError:
    # The error type schema.py renders: `ebb_message` is the whole message.
    return PydanticCustomError("ebb_invalid", "{ebb_message}", {"ebb_message": message, "at": at})


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class TextPart(_Strict):
    """input_text (what a caller writes) or output_text (an earlier answer echoed back)."""

    type: Literal["input_text", "output_text"]
    text: str
    # What an echoed output_text part carries; nothing here produces either.
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


def _text_parts(value: Any) -> Any:
    """A string, or parts whose types are text: images, files and audio are refused."""
    if isinstance(value, list):
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in _PART_TYPES:
                raise _invalid(
                    f"content parts of type {_show(kind)} are not supported; this model takes "
                    'text only: {"type": "input_text", "text": "..."}',
                    at=i,
                )
    return value


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[TextPart]
    id: ItemId | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    _parts = field_validator("content", mode="before")(_text_parts)


class FunctionCallItem(_Strict):
    """A call the model made, sent back so the next turn sees it."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    name: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    arguments: str
    id: ItemId | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(_Strict):
    """A function's result, answering the call `call_id`."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    output: str | list[TextPart]
    id: ItemId | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    _parts = field_validator("output", mode="before")(_text_parts)


class ItemReference(_Strict):
    """An output item of an earlier stored response, by id (what the AI SDK sends for
    earlier assistant text when responses are stored)."""

    type: Literal["item_reference"]
    id: str = Field(min_length=1, max_length=MAX_ID_CHARS)


def _item_type(value: Any) -> str | None:
    if isinstance(value, dict):
        kind: str | None = value.get("type", "message")  # an "easy" message has no type
        return kind
    return getattr(value, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ItemReference, Tag("item_reference")],
    Discriminator(_item_type),
]


class FunctionTool(_Strict):
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(_Strict):
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = Field(default=None, max_length=MAX_FORMAT_DESCRIPTION_CHARS)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _schema_bounded(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        size = len(json.dumps(value)) if value is not None else 0
        if size > MAX_FORMAT_SCHEMA_BYTES:
            raise _invalid(
                f"the schema is {size} bytes as JSON; at most {MAX_FORMAT_SCHEMA_BYTES} are "
                "accepted: shorten it (move long explanations out of it)"
            )
        return value

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> TextFormat:
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            raise _invalid('text.format of type "json_schema" needs name and schema')
        if self.type != "json_schema" and (self.name or self.schema_ or self.description):
            raise _invalid(
                f'name, schema and description belong to "json_schema", not {self.type!r}'
            )
        return self


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class StreamOptions(_Strict):
    include_obfuscation: bool | None = None


MetadataKey = Annotated[str, StringConstraints(max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]


class ResponsesRequest(_Strict, IgnoredHints):
    model: str = Field(min_length=1)
    # Echoed by the Response object (stored, and in a stream's view), never tokenised.
    user: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    metadata: dict[MetadataKey, MetadataValue] | None = Field(
        default=None, max_length=MAX_METADATA_KEYS
    )
    previous_response_id: str | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    background: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _drop_neutral_fields(cls, data: Any) -> Any:
        return _drop_neutral(data, _UNSUPPORTED)

    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, value: Any) -> Any:
        if isinstance(value, str) and not value:
            raise _invalid("input is empty; send the text, or a list of input items")
        if isinstance(value, list):
            if not value:
                raise _invalid("input is empty; send at least one item")
            for i, item in enumerate(value):
                kind = _item_type(item)
                if kind not in _ITEM_TYPES:
                    raise _invalid(
                        f"input items of type {_show(kind)} are not supported; send "
                        f"{', '.join(_ITEM_TYPES)} items",
                        at=i,
                    )
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools_only(cls, value: Any) -> Any:
        for i, tool in enumerate(value if isinstance(value, list) else []):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind != "function":
                raise _invalid(
                    f"tools of type {_show(kind)} are not supported; this server runs "
                    'function tools only (your code runs them: type "function")',
                    at=i,
                )
        return value

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _known_choice(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in ("none", "auto", "required"):
            raise _invalid(
                f'tool_choice must be "none", "auto", "required" or a function; got {value!r}'
            )
        if isinstance(value, dict) and value.get("type") != "function":
            raise _invalid(
                'tool_choice must be "none", "auto", "required" or {"type": "function", '
                f'"name": ...}}; got type {_show(value.get("type"))}'
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ResponsesRequest:
        if self.stream_options is not None and not self.stream:
            raise _invalid(
                "stream_options is only allowed when stream is true", at="stream_options"
            )
        if self.background and self.stream:
            raise _invalid(
                "a background response is not streamed; remove stream and poll "
                "GET /v1/responses/{id}",
                at="stream",
            )
        if self.background and self.store is False:
            raise _invalid("a background response is stored; remove store: false", at="store")
        return self

    @property
    def stored(self) -> bool:
        """Whether the response is kept for GET and previous_response_id (default: yes)."""
        return self.store is not False


def parse_responses_request(body: object) -> ResponsesRequest:
    """Validate a `POST /v1/responses` body; raises InvalidRequest with `param` set."""
    if not isinstance(body, dict):
        return parse_body(ResponsesRequest, body)  # its refusal of a non-object body
    try:
        return ResponsesRequest.model_validate(body)
    except ValidationError as e:
        raise _refusal(e) from e


def _refusal(exc: ValidationError) -> InvalidRequest:
    """The most specific problem, its path without pydantic's union member labels
    ("input.str", "input.list[...]"): a string-or-items field fails once per member, and
    the member the caller meant is the one that got furthest (or raised our own error)."""
    errors = exc.errors(include_url=False)
    error = max(errors, key=lambda e: (e["type"] == "ebb_invalid", len(e["loc"])))
    ctx = error.get("ctx") or {}
    path = list(error["loc"])
    last = len(path) - 1
    loc: list[str] = []
    for i, part in enumerate(path):
        if (
            isinstance(part, int)
            or part in _FIELD_NAMES
            or loc[-1:] == ["metadata"]  # a metadata key
            or (i == last and error["type"] == "extra_forbidden")
        ):
            loc.append(str(part))
    if ctx.get("at") is not None:
        loc.append(str(ctx["at"]))
    param = ".".join(loc) or None
    return InvalidRequest(_describe(error, param or "the request body", ctx), param=param)


_FIELD_NAMES = frozenset(
    name
    for model in (
        ResponsesRequest,
        MessageItem,
        FunctionCallItem,
        FunctionCallOutputItem,
        ItemReference,
        TextPart,
        FunctionTool,
        FunctionChoice,
        TextFormat,
        TextConfig,
        StreamOptions,
    )
    for field_name, info in model.model_fields.items()
    for name in (field_name, info.alias)
    if name
)
