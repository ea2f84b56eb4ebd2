"""Turning a request's messages or prompt into the token ids a runner is given.

The frontdoor tokenizes (not the runner) so that it can refuse a prompt longer than the
model's context with a 400 before anything is queued, and so that usage and admission see
the real prompt length. The model's context length is the caller's business, not this one's.
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

from ebb.errors import InvalidRequest
from ebb.openai.chat_template import (
    ChatTemplate,
    compile_template,
    special_tokens_of,
    template_source,
)
from ebb.openai.template_budget import TemplateLimits

# Deployment templates kept compiled per tokenizer (the least recently used go first).
_MAX_COMPILED_OVERRIDES = 64


class PromptTokenizer(Protocol):
    """A deployed model's tokenizer, as the frontdoor needs it.

    Contract: `render_chat` takes OpenAI-style messages already reduced to
    `{"role": str, "content": str}` (roles system/user/assistant/tool, plus `tool_calls`
    and `tool_call_id` where a conversation has them), applies the model's chat template
    (or `chat_template`, a deployment's own) with `tools` and the generation prompt for
    the assistant's next turn, and returns the ids
    exactly as the engine must see them (special tokens included). It raises InvalidRequest
    when the model cannot render the conversation, or its template passes its render
    budget (`TemplateLimits`, given when the tokenizer is made). `encode` tokenizes a plain
    completions prompt the way the model expects one (adding a BOS token if the model uses
    one). Both are safe to call from several threads at once.
    """

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        chat_template: str = "",
    ) -> list[int]: ...

    def chat_template_text(self, override: str = "") -> str:
        """The template render_chat would use ("" if none): tool support is read from it."""
        ...

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """`add_special_tokens` off: the text's own ids only (POST /tokenize may ask)."""
        ...

    def decode(self, token_ids: list[int]) -> str:
        """The text of ids below vocab_size, special tokens included (POST /detokenize)."""
        ...

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to vocab_size - 1."""
        ...


class HfPromptTokenizer:
    """A Hugging Face tokenizer from a local HF-layout directory, read the way transformers
    reads it (so the ids are the ones the engine's own tokenizer gives) without importing
    transformers, which would bring torch into the frontdoor (~450 MB): `tokenizer.json`
    through the `tokenizers` library, the chat template through jinja2 in the sandboxed
    environment transformers renders it in (`chat_template.render`)."""

    def __init__(
        self,
        tokenizer: Any,
        template: ChatTemplate | None,
        source: str = "",
        special_tokens: dict[str, str] | None = None,
        limits: TemplateLimits | None = None,
    ):
        self._tokenizer = tokenizer
        self._limits = limits or TemplateLimits()
        self._template = template
        self._source = source
        self._special_tokens = special_tokens or {}
        # Deployment-supplied templates (serving.chat_template), compiled once each.
        self._overrides: OrderedDict[str, ChatTemplate] = OrderedDict()
        # One Rust object behind every call; serialised as transformers' own use needs.
        self._lock = threading.Lock()

    @classmethod
    def from_dir(cls, path: str | Path, limits: TemplateLimits | None = None) -> HfPromptTokenizer:
        from tokenizers import Tokenizer

        root = Path(path)
        config = _read_json(root / "tokenizer_config.json")
        if not (root / "tokenizer.json").is_file():
            raise OSError(
                f"{root} has no tokenizer.json; ebb reads fast (tokenizers) tokenizers only"
            )
        # As is: with a tokenizer.json, transformers ignores the config's add_bos_token
        # and add_eos_token and keeps the file's post-processor too.
        tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        source = template_source(root, config)
        special = special_tokens_of(config)
        template = ChatTemplate(source, special) if source else None
        return cls(tokenizer, template, source or "", special, limits)

    @property
    def vocab_size(self) -> int:
        # Added special tokens count: they are ids the engine accepts.
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def chat_template_text(self, override: str = "") -> str:
        return override or self._source

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        chat_template: str = "",
    ) -> list[int]:
        template = self._override(chat_template) if chat_template else self._template
        if template is None:
            raise InvalidRequest(
                "This model has no chat template, so it cannot serve /v1/chat/completions; "
                "send a plain prompt to /v1/completions instead.",
                param="messages",
            )
        # The template holds the special tokens itself: encode without adding more.
        text = template.render(messages, self._limits, tools=tools)
        with self._lock:
            return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def _override(self, source: str) -> ChatTemplate:
        with self._lock:
            template = self._overrides.get(source)
            if template is not None:
                self._overrides.move_to_end(source)
                return template
        # Compiled outside the lock (it takes milliseconds); a race compiles it twice.
        template = compile_template(source, self._special_tokens)
        with self._lock:
            self._overrides[source] = template
            while len(self._overrides) > _MAX_COMPILED_OVERRIDES:
                self._overrides.popitem(last=False)
        return template

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        with self._lock:
            return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: list[int]) -> str:
        with self._lock:
            return str(self._tokenizer.decode(token_ids, skip_special_tokens=False))


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    loaded = json.loads(path.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else {}


@functools.lru_cache(maxsize=16)
def _compiled(source: str) -> ChatTemplate:
    return compile_template(source)


class ByteTokenizer:
    """UTF-8 bytes as token ids (0..255), for the fake engine in tests.

    Chat rendering is "<|role|>content\\n" per message followed by "<|assistant|>"; tools,
    when given, come first as "<|tools|>" and their JSON. A deployment's own template
    (`chat_template`) renders as on a real model's tokenizer, in the same budgeted sandbox.
    """

    def __init__(self, limits: TemplateLimits | None = None):
        self._limits = limits or TemplateLimits()

    def chat_template_text(self, override: str = "") -> str:
        return override

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        chat_template: str = "",
    ) -> list[int]:
        if chat_template:
            template = _compiled(chat_template)
            return self.encode(template.render(messages, self._limits, tools=tools))
        rendered = f"<|tools|>{json.dumps(tools)}\n" if tools else ""
        rendered += "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        return self.encode(rendered + "<|assistant|>")

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))  # no special tokens to add

    @property
    def vocab_size(self) -> int:
        return 256

    def decode(self, token_ids: list[int]) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")
