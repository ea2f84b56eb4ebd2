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
from ebb.frontdoor.chat_template import ChatTemplate, special_tokens_of, template_source


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

    def render_chat(self, messages: list[dict[str, Any]]) -> list[int]: ...

    def encode(self, text: str) -> list[int]: ...


class HfPromptTokenizer:
    """A Hugging Face tokenizer from a local HF-layout directory, read the way transformers
    reads it (so the ids are the ones the engine's own tokenizer gives) without importing
    transformers, which would bring torch into the frontdoor (~450 MB): `tokenizer.json`
    through the `tokenizers` library, the chat template through jinja2 in the sandboxed
    environment transformers renders it in (`chat_template.render`)."""

    def __init__(self, tokenizer: Any, template: ChatTemplate | None):
        self._tokenizer = tokenizer
        self._template = template
        # One Rust object behind every call; serialised as transformers' own use needs.
        self._lock = threading.Lock()

    @classmethod
    def from_dir(cls, path: str | Path) -> HfPromptTokenizer:
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
        template = ChatTemplate(source, special_tokens_of(config)) if source else None
        return cls(tokenizer, template)

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def render_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        if self._template is None:
            raise InvalidRequest(
                "This model has no chat template, so it cannot serve /v1/chat/completions; "
                "send a plain prompt to /v1/completions instead.",
                param="messages",
            )
        # The template holds the special tokens itself: encode without adding more.
        text = self._template.render(messages)
        with self._lock:
            return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str) -> list[int]:
        with self._lock:
            return list(self._tokenizer.encode(text, add_special_tokens=True).ids)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    loaded = json.loads(path.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else {}


class ByteTokenizer:
    """UTF-8 bytes as token ids (0..255), for the fake engine in tests.

    Chat rendering is "<|role|>content\\n" per message followed by "<|assistant|>".
    """

    def render_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        rendered = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        return self.encode(rendered + "<|assistant|>")

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")
