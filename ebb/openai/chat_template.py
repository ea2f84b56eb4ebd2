"""A model's chat template, rendered as transformers renders it (`apply_chat_template`),
without importing transformers: the same sandboxed jinja2 environment (trim_blocks,
lstrip_blocks, loop controls), the same `tojson` filter and globals (`raise_exception`,
`strftime_now`), and the tokenizer's special tokens (bos_token, eos_token, …) as variables.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

# The special tokens transformers passes to every template (its SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def special_tokens_of(config: dict[str, Any]) -> dict[str, str]:
    """The special tokens a tokenizer_config.json names (a string or an AddedToken dict)."""
    tokens = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[name] = value
    return tokens


def template_source(root: Path, config: dict[str, Any]) -> str | None:
    """The default chat template of the tokenizer in `root`, where transformers looks for
    it: chat_template.jinja beside the config (newer saves), else the config's own field
    (a string, or a list of named templates of which "default" is the one used)."""
    standalone = root / "chat_template.jinja"
    if standalone.is_file():
        return standalone.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Not jinja2's own tojson, which escapes HTML characters.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str]):
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = _strftime_now
        self._template = environment.from_string(source)
        self._special_tokens = special_tokens

    def render(self, messages: list[dict[str, Any]], **variables: Any) -> str:
        """The conversation with the prompt for the assistant's next turn. `variables`
        (e.g. `tools`) are passed to the template as apply_chat_template passes them.
        Raises InvalidRequest when the template refuses the messages
        (`raise_exception`, e.g. roles that do not alternate); a template that cannot be
        parsed or fails otherwise is the model's problem, raised as it is."""
        from jinja2 import TemplateError, TemplateSyntaxError

        from ebb.errors import InvalidRequest

        context = {"tools": None, "documents": None, **self._special_tokens, **variables}
        try:
            return self._template.render(messages=messages, add_generation_prompt=True, **context)
        except TemplateSyntaxError:
            raise
        except TemplateError as e:
            raise InvalidRequest(
                f"This model's chat template refused the messages: {e}", param="messages"
            ) from e
