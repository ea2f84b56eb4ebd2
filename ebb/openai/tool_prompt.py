"""A chat request's tools, planned for the engine: what the prompt shows, what guided
decoding enforces, and how the reply is parsed back (`ToolCallFormat`).

As in vLLM: a named `tool_choice` constrains the reply to the function's arguments schema,
`required` to a JSON array of calls, and in `auto` mode functions marked `"strict": true`
are constrained once the model opens a call (a structural tag triggered by the parser's
call marker). Models whose chat template has no place for tools get them in a system
message in the parser's syntax, and past calls as text, so that small models can still
see what they may call. Nothing here does I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ebb.errors import InvalidRequest
from ebb.openai.schema import ChatCompletionRequest, ChatMessage
from ebb.openai.tool_calls import (
    parser_for_template,
    render_calls_as_text,
    system_prompt_for_tools,
)
from ebb.queue.schema import ServingOptions, ToolCallFormat


@dataclass(frozen=True)
class ToolPlan:
    fmt: ToolCallFormat | None  # None: the reply is plain content
    json_schema: dict[str, Any] | None = None  # the whole reply must match it
    structural_tag: str | None = None  # calls, once opened, must match their schemas
    skip_special_tokens: bool | None = None  # parsers that read special tokens need them


def plan_tools(req: ChatCompletionRequest, chat_template: str, serving: ServingOptions) -> ToolPlan:
    """How the reply may call tools; InvalidRequest for what this deployment cannot do."""
    mode = req.tool_mode
    if mode == "none":
        return ToolPlan(None)
    if req.response_format is not None and req.response_format.type != "text":
        raise InvalidRequest(
            "response_format and tools cannot both shape the reply; drop response_format "
            'or set tool_choice to "none"',
            param="response_format",
        )
    parallel = req.parallel_tool_calls is not False
    if mode == "named":
        function = req.forced_function()
        assert function is not None  # validated: the named choice is declared
        fmt = ToolCallFormat(mode="named", function=function.name, parallel=parallel)
        return ToolPlan(fmt, json_schema=function.arguments_schema)
    if mode == "required":
        return ToolPlan(
            ToolCallFormat(mode="required", parallel=parallel), _calls_schema(req, parallel)
        )
    parser = _parser(serving, chat_template)
    fmt = ToolCallFormat(mode="auto", parser=parser, parallel=parallel)
    return ToolPlan(
        fmt,
        structural_tag=_strict_tag(req, parser),
        skip_special_tokens=False if parser == "mistral" else None,
    )


def _parser(serving: ServingOptions, chat_template: str) -> str:
    if serving.tool_parser == "none":
        raise InvalidRequest(
            "This deployment has automatic tool calls turned off; force a call with "
            'tool_choice "required" or a named function, or set tool_choice to "none".',
            param="tool_choice",
        )
    if serving.tool_parser:
        return serving.tool_parser
    return parser_for_template(chat_template)


def _calls_schema(req: ChatCompletionRequest, parallel: bool) -> dict[str, Any]:
    """A JSON array of one or more calls of the declared functions (vLLM's "required")."""
    choices = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                "parameters": t.function.arguments_schema,
            },
            "required": ["name", "parameters"],
        }
        for t in req.tools or []
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": choices}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


_TAG_SHAPES = {
    # parser: (trigger, text before the arguments, text after them); {name} is the function.
    "hermes": ("<tool_call>", '<tool_call>\n{{"name": "{name}", "arguments": ', "}\n</tool_call>"),
    "llama3_json": ('{"name":', '{{"name": "{name}", "parameters": ', "}"),
    "mistral": ("[TOOL_CALLS]", '[TOOL_CALLS][{{"name": "{name}", "arguments": ', "}]"),
}


def _strict_tag(req: ChatCompletionRequest, parser: str) -> str | None:
    strict = [t.function for t in req.tools or [] if t.function.strict]
    if not strict:
        return None
    trigger, begin, end = _TAG_SHAPES[parser]
    structures = [
        {"begin": begin.format(name=f.name), "schema": f.arguments_schema, "end": end}
        for f in strict
    ]
    return json.dumps({"type": "structural_tag", "structures": structures, "triggers": [trigger]})


def template_messages(
    req: ChatCompletionRequest, chat_template: str, plan: ToolPlan
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages (and tools) to render with the chat template.

    Templates that know tools get them as `tools=`; others get a system message.
    """
    parser = plan.fmt.parser if plan.fmt else "hermes"
    native_calls = "tool_calls" in chat_template
    messages = [_message(m, parser, native_calls) for m in req.messages]
    if plan.fmt is None or not req.tools:
        return messages, None
    tools = [t.model_dump(exclude_none=True) for t in req.tools]
    if "tools" in chat_template:
        return messages, tools
    instructions = system_prompt_for_tools(tools, parser)
    if messages and messages[0]["role"] == "system":
        messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{instructions}"}
    else:
        messages.insert(0, {"role": "system", "content": instructions})
    return messages, None


def _message(m: ChatMessage, parser: str, native_calls: bool) -> dict[str, Any]:
    # Chat templates predate OpenAI's "developer" role and many raise on unknown roles;
    # OpenAI itself treats developer messages as the system prompt.
    message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role}
    message["content"] = m.content or ""
    if m.name is not None:
        message["name"] = m.name
    if m.tool_call_id is not None:
        message["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        calls = [c.model_dump() for c in m.tool_calls]
        if native_calls:
            # HF templates render arguments with `tojson`: they expect an object.
            message["tool_calls"] = [_arguments_as_object(c) for c in calls]
        else:
            text = render_calls_as_text(calls, parser)
            message["content"] = f"{message['content']}\n{text}".strip()
    return message


def _arguments_as_object(call: dict[str, Any]) -> dict[str, Any]:
    try:
        arguments = json.loads(call["function"]["arguments"])
    except ValueError:
        return call
    if not isinstance(arguments, dict):
        return call
    return {**call, "function": {**call["function"], "arguments": arguments}}
