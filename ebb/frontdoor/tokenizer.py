"""Turning a request's messages or prompt into the token ids a runner is given.

The frontdoor tokenizes (not the runner) so that it can refuse a prompt longer than the
model's context with a 400 before anything is queued, and so that usage and admission see
the real prompt length. The model's context length is the caller's business, not this one's.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Protocol

from ebb.errors import InvalidRequest


class PromptTokenizer(Protocol):
    """A deployed model's tokenizer, as the frontdoor needs it.

    Contract: `render_chat` takes OpenAI-style messages already reduced to
    `{"role": str, "content": str}` (roles system/user/assistant), applies the model's chat
    template with the generation prompt for the assistant's next turn, and returns the ids
    exactly as the engine must see them (special tokens included). It raises InvalidRequest
    when the model cannot render the conversation. `encode` tokenizes a plain completions
    prompt the way the model expects one (adding a BOS token if the model uses one). Both
    are safe to call from several threads at once.
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

    def encode(self, text: str) -> list[int]: ...

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to vocab_size - 1."""
        ...


class HfPromptTokenizer:
    """A Hugging Face tokenizer loaded from a local HF-layout directory."""

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        # Fast tokenizers share one Rust object whose padding/truncation state is mutable;
        # concurrent calls can fail with "Already borrowed", so calls are serialised.
        self._lock = threading.Lock()

    @classmethod
    def from_dir(cls, path: str | Path) -> HfPromptTokenizer:
        # Imported here: transformers takes seconds to import and most processes never
        # tokenize.
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(path)))

    @property
    def vocab_size(self) -> int:
        # len() counts added special tokens, which vocab_size alone does not.
        return len(self._tokenizer)

    @property
    def has_chat_template(self) -> bool:
        return getattr(self._tokenizer, "chat_template", None) is not None

    def chat_template_text(self, override: str = "") -> str:
        template = override or getattr(self._tokenizer, "chat_template", None) or ""
        # A few models ship several named templates; any of them mentioning tools counts.
        return template if isinstance(template, str) else json.dumps(template)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        chat_template: str = "",
    ) -> list[int]:
        if not (chat_template or self.has_chat_template):
            raise InvalidRequest(
                "This model has no chat template, so it cannot serve /v1/chat/completions; "
                "send a plain prompt to /v1/completions instead.",
                param="messages",
            )
        from jinja2 import TemplateError, TemplateSyntaxError

        with self._lock:
            try:
                # Rendering to text first, then encoding without extra special tokens: the
                # template already holds them, and transformers 5 returns a BatchEncoding
                # rather than ids when asked to tokenize directly.
                text = self._tokenizer.apply_chat_template(
                    messages,
                    tools=tools,
                    chat_template=chat_template or None,
                    add_generation_prompt=True,
                    tokenize=False,
                )
            except TemplateSyntaxError:
                raise  # the model's template is broken: a server problem, not the caller's
            except TemplateError as e:
                # Templates reject conversations with `raise_exception(...)`, e.g. roles
                # that do not alternate; that message is the caller's to act on.
                raise InvalidRequest(
                    f"This model's chat template refused the messages: {e}", param="messages"
                ) from e
            return list(self._tokenizer.encode(text, add_special_tokens=False))

    def encode(self, text: str) -> list[int]:
        with self._lock:
            return list(self._tokenizer.encode(text, add_special_tokens=True))


class ByteTokenizer:
    """UTF-8 bytes as token ids (0..255), for the fake engine in tests.

    Chat rendering is "<|role|>content\\n" per message followed by "<|assistant|>"; tools,
    when given, come first as "<|tools|>" and their JSON.
    """

    def chat_template_text(self, override: str = "") -> str:
        return override

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        chat_template: str = "",
    ) -> list[int]:
        rendered = f"<|tools|>{json.dumps(tools)}\n" if tools else ""
        rendered += "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        return self.encode(rendered + "<|assistant|>")

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    @property
    def vocab_size(self) -> int:
        return 256

    def decode(self, token_ids: list[int]) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")
