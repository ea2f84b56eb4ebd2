"""A model's chat template, rendered as transformers renders it (`apply_chat_template`),
without importing transformers: the same sandboxed jinja2 environment (trim_blocks,
lstrip_blocks, loop controls), the same `tojson` filter and globals (`raise_exception`,
`strftime_now`), and the tokenizer's special tokens (bos_token, eos_token, …) as variables.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from ebb.errors import InvalidRequest
from ebb.openai.template_budget import (
    RenderBudget,
    RenderNeedsThread,
    TemplateBudgetExceeded,
    TemplateLimits,
    rendering,
    rendering_inline,
)

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


# A template's source is at most this long (a real one is a few KiB; the largest, with
# tool-call formats, ~20 KiB): the deployment API's bound on serving.chat_template.
MAX_TEMPLATE_CHARS = 65536


def compile_template(source: str, special_tokens: dict[str, str] | None = None) -> ChatTemplate:
    """`source` compiled, or InvalidRequest (param "serving.chat_template") naming the line
    and what is wrong: a deployment's template is checked when it is deployed."""
    from jinja2 import TemplateSyntaxError

    if len(source) > MAX_TEMPLATE_CHARS:
        raise InvalidRequest(
            f"serving.chat_template is {len(source):,} characters; at most {MAX_TEMPLATE_CHARS:,}.",
            param="serving.chat_template",
        )
    try:
        return ChatTemplate(source, special_tokens or {})
    except TemplateSyntaxError as e:
        raise InvalidRequest(
            f"serving.chat_template does not compile: line {e.lineno}: {_sentence(e.message)} Fix "
            "the Jinja there (only the filters and str methods of transformers' chat "
            "templates are available; see docs/DEPLOYMENTS.md).",
            param="serving.chat_template",
        ) from e
    except (RecursionError, MemoryError, SyntaxError) as e:  # nesting past the compiler
        raise InvalidRequest(
            "serving.chat_template is nested too deeply to compile; flatten its blocks "
            "and expressions.",
            param="serving.chat_template",
        ) from e


class ChatTemplate:
    """A compiled template, rendered in the budgeted sandbox (`template_sandbox`)."""

    def __init__(self, source: str, special_tokens: dict[str, str]):
        from ebb.openai.template_sandbox import BudgetedSandbox

        environment = BudgetedSandbox()
        environment.add_filter("tojson", _tojson)
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = _strftime_now
        self._template = environment.from_string(source)
        self._source = source
        self._special_tokens = special_tokens

    def render(
        self, messages: list[dict[str, Any]], limits: TemplateLimits, **variables: Any
    ) -> str:
        """`render_here`, in a worker process (`template_pool`) when `limits` has
        processes and the render is not inline (on the event loop, under its step cap)."""
        if limits.processes and not rendering_inline():
            from ebb.openai.template_pool import render_in_pool

            return render_in_pool(self._source, self._special_tokens, messages, limits, variables)
        return self.render_here(messages, limits, **variables)

    def render_here(
        self, messages: list[dict[str, Any]], limits: TemplateLimits, **variables: Any
    ) -> str:
        """The conversation with the prompt for the assistant's next turn. `variables`
        (e.g. `tools`) are passed to the template as apply_chat_template passes them.
        Raises InvalidRequest when the template refuses the messages
        (`raise_exception`, e.g. roles that do not alternate), fails on them, or passes
        `limits` (its render budget); RenderNeedsThread when an inline render ran past
        its step cap (`template_budget.inline_renders`)."""
        from jinja2 import TemplateError

        context = {"tools": None, "documents": None, **self._special_tokens, **variables}
        try:
            with rendering(limits) as budget:
                return _joined(
                    self._template.generate(
                        messages=messages, add_generation_prompt=True, **context
                    ),
                    budget,
                )
        except RenderNeedsThread:
            raise
        except TemplateBudgetExceeded as e:
            raise _over_budget(e.what) from e
        except (RecursionError, MemoryError) as e:
            raise _over_budget("nested too deeply") from e
        except TemplateError as e:
            raise InvalidRequest(
                f"This model's chat template refused the messages: {e}", param="messages"
            ) from e
        except (TypeError, ValueError, LookupError, ArithmeticError) as e:
            raise InvalidRequest(
                f"This model's chat template failed on the messages "
                f"({type(e).__name__}: {e}); check the messages' roles and fields, or "
                "the template (serving.chat_template).",
                param="messages",
            ) from e


def _joined(chunks: Iterator[str], budget: RenderBudget) -> str:
    """The render's output, refused once it passes the output limit."""
    limit = budget.limits.max_output_chars
    out: list[str] = []
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise TemplateBudgetExceeded(f"an output of more than {limit:,} characters")
        out.append(chunk)
    return "".join(out)


def _over_budget(what: str) -> InvalidRequest:
    return InvalidRequest(
        f"This deployment's chat template exceeded its render budget ({what}) for these "
        "messages; send a shorter conversation, or simplify the template "
        "(serving.chat_template).",
        param="messages",
        code="chat_template_budget",
    )


def _sentence(message: str | None) -> str:
    text = (message or "syntax error").rstrip()
    return text if text.endswith(".") else text + "."
