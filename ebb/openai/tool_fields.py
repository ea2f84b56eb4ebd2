"""Tool calling in a chat request, validated: `tools`, `tool_choice`, `parallel_tool_calls`,
and the message fields that carry a conversation's calls and their results.

Contract: the models here only check shape and consistency (a named choice names a
declared function, a tool message answers a call id); what the model can render and how
its replies are parsed is `translate.py`'s and `ebb.openai.tool_calls`'.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

MAX_TOOLS = 128
FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


def _invalid(message: str, *, at: str | int | None = None) -> PydanticCustomError:
    # The same error type schema.py renders: `ebb_message` is the whole message.
    return PydanticCustomError("ebb_invalid", "{ebb_message}", {"ebb_message": message, "at": at})


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class FunctionDefinition(_Strict):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    # A JSON schema of the arguments object; absent means the function takes none.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value and value.get("type") != "object":
            raise _invalid(
                'function parameters must be a JSON schema with "type": "object" '
                f"(the arguments are an object); got type {value.get('type')!r}"
            )
        return value

    @property
    def arguments_schema(self) -> dict[str, Any]:
        """The schema the arguments must match; an object with no properties if none."""
        return self.parameters or {"type": "object", "properties": {}}


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Strict):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(_Strict):
    name: str = Field(min_length=1)
    # JSON text, as OpenAI sends it; not re-validated (a model may have produced it).
    arguments: str


class ToolCallMessagePart(_Strict):
    """One call in an assistant message's `tool_calls` (echoed back by the client)."""

    id: str = Field(min_length=1)
    type: Literal["function"]
    function: FunctionCall


class ToolFields(_Strict):
    """The tool fields of a chat request; mixed into ChatCompletionRequest."""

    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _known_choice(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in ("none", "auto", "required"):
            raise _invalid(
                'tool_choice must be "none", "auto", "required" or '
                f'{{"type": "function", "function": {{"name": ...}}}}; got {value!r}'
            )
        return value

    @model_validator(mode="after")
    def _choice_matches_tools(self) -> ToolFields:
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise _invalid("tools declares the same function name twice", at="tools")
        choice = self.tool_choice
        forced = choice == "required" or isinstance(choice, NamedToolChoice)
        if forced and not names:
            raise _invalid(
                "tool_choice forces a tool call, but tools is empty; declare the "
                "functions in tools",
                at="tool_choice",
            )
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise _invalid(
                f"tool_choice names the function {choice.function.name!r}, which tools "
                f"does not declare (declared: {', '.join(names)})",
                at="tool_choice",
            )
        return self

    def forced_function(self) -> FunctionDefinition | None:
        """The function a named tool_choice forces, if any."""
        if not isinstance(self.tool_choice, NamedToolChoice):
            return None
        wanted = self.tool_choice.function.name
        return next(t.function for t in self.tools or [] if t.function.name == wanted)

    @property
    def tool_mode(self) -> Literal["none", "auto", "required", "named"]:
        """How the reply may call tools: not at all, as the model likes, or forced."""
        if not self.tools or self.tool_choice == "none":
            return "none"
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        return "required" if self.tool_choice == "required" else "auto"
