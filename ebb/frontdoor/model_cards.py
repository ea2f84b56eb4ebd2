"""`/v1/models` entries: OpenAI's model object plus what the deployment's model can do.

OpenAI's fields (`id`, `object`, `created`, `owned_by`) come first, so clients that know
only those keep working; `max_model_len` is named as vLLM's server names it, and
`capabilities` says which endpoints the model serves. Facts that need the model's files
(its context length, whether it has a chat template) are null until the frontdoor has
read them; reading them never waits here.
"""

from __future__ import annotations

from typing import Any

from ebb.errors import CapacityError, WeightsError
from ebb.frontdoor.catalog import ModelCatalog, ModelInfo
from ebb.queue.schema import DeploymentSpec


async def model_card(
    catalog: ModelCatalog, spec: DeploymentSpec, base: DeploymentSpec | None = None
) -> dict[str, Any]:
    """`spec`'s card; an adapter's model facts are its `base`'s (None: unknown)."""
    if spec.base:
        info = None if base is None else await _known_info(catalog, base)
    else:
        info = await _known_info(catalog, spec)
    embed = spec.serving.task == "embed"
    chat = None if info is None else _serves_chat(info, spec) and not embed
    return {
        "id": spec.name,
        "object": "model",
        "created": int(spec.created_at_s),
        "owned_by": "ebb",
        # A LoRA adapter names its base, as vLLM's server lists its LoRA modules.
        "parent": spec.base or None,
        "max_model_len": spec.max_model_len if info is None else info.max_model_len,
        "capabilities": {
            "chat_completions": chat,
            "completions": not embed,
            "embeddings": embed,
            # Forced calls need only guided decoding; chosen ones need a parser too.
            "tools": chat,
            "tool_choice_auto": None if chat is None else chat and _auto_tools(spec),
        },
    }


async def _known_info(catalog: ModelCatalog, spec: DeploymentSpec) -> ModelInfo | None:
    try:
        return await catalog.info(spec, wait_s=0)
    except (CapacityError, WeightsError):
        return None  # still being prepared, or failed: the deployment's status says


def _serves_chat(info: ModelInfo, spec: DeploymentSpec) -> bool:
    if spec.serving.chat_template:
        return True
    return bool(getattr(info.tokenizer, "has_chat_template", True))


def _auto_tools(spec: DeploymentSpec) -> bool:
    return spec.serving.tool_parser != "none"
