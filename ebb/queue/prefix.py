"""The prompt-prefix key that prefix-aware claiming matches requests to runners by.

Requests whose prompts start alike (a shared system prompt, a few-shot preamble, the
earlier turns of one conversation) share a key; the runner that last claimed a request
with that key probably still holds its KV blocks in the engine's prefix cache, so the
claim script leaves such a request for that runner for a short, bounded wait
(`lua/claim.lua`).

The key hashes the first `PREFIX_TOKENS` tokens, rounded down to whole blocks of
`BLOCK_TOKENS`; a prompt shorter than one block has none (caching it saves nothing
worth a wait). Prompts sharing fewer tokens than their keys cover do not match: the key
is a cheap approximation of the engine's per-block hashes, not a copy of them.
"""

from __future__ import annotations

import hashlib
from array import array

from ebb.queue.schema import WorkItem
from ebb.queue.versions import adapter_version_key

BLOCK_TOKENS = 64
PREFIX_TOKENS = 256


def affinity_key(work: WorkItem) -> str:
    """The key claim.lua matches `work` to a runner by: a LoRA adapter's request goes to
    the runner that last claimed one of that adapter's version (it holds it loaded, and
    its KV blocks are the adapter's own), whatever its prompt; others by prompt prefix."""
    if work.adapter is not None:
        return "lora-" + adapter_version_key(work.adapter)
    return prefix_key(work.prompt_token_ids)


def prefix_key(prompt_token_ids: list[int]) -> str:
    """The key of a prompt ('' for none)."""
    covered = min(PREFIX_TOKENS, len(prompt_token_ids)) // BLOCK_TOKENS * BLOCK_TOKENS
    if covered == 0:
        return ""
    tokens = array("q", prompt_token_ids[:covered]).tobytes()
    return hashlib.blake2b(tokens, digest_size=8).hexdigest()
