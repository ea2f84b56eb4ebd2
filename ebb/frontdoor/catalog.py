"""What the frontdoor must know of each deployment's model before admitting a request:
its tokenizer (to render chats, count and check prompt tokens) and its context length.

The weights themselves are prepared by the controller (`ebb.coldstart.preparer`, in a
process of its own), which publishes where they are in the deployment's weights status;
the frontdoor only reads the tokenizer from there, once per model directory. A request
that arrives while the weights are prepared waits for them within its admission window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ebb.config import Settings
from ebb.engines import EngineRegistry
from ebb.errors import CapacityError, WeightsError
from ebb.openai.template_budget import TemplateLimits
from ebb.openai.tokenizer import HfPromptTokenizer, PromptTokenizer
from ebb.queue.platform import PlatformState
from ebb.queue.schema import DeploymentSpec
from ebb.queue.weights_status import WeightsState, WeightsStatus

log = logging.getLogger(__name__)

# The code of the refusal while weights are prepared: a passing state (async work waits).
WEIGHTS_PREPARING = "weights_preparing"
# How often a waiting request looks at the weights status again.
_STATUS_POLL_S = 0.1
# How long a warm-up waits for weights still being prepared (a conversion or a fetch).
_WARM_WAIT_S = 600.0


@dataclass(frozen=True)
class ModelInfo:
    tokenizer: PromptTokenizer
    max_model_len: int


def template_limits(settings: Settings) -> TemplateLimits:
    """The chat templates' render budget the settings give."""
    return TemplateLimits(
        max_steps=settings.chat_template_max_steps,
        timeout_s=settings.chat_template_timeout_s,
        max_output_chars=settings.chat_template_max_output_chars,
        processes=settings.chat_template_processes,
    )


class ModelCatalog:
    def __init__(
        self,
        state: PlatformState,
        engines: EngineRegistry | None = None,
        template_limits: TemplateLimits | None = None,
    ):
        self._state = state
        # Every chat template's render budget (settings EBB_CHAT_TEMPLATE_*).
        self._limits = template_limits or TemplateLimits()
        # Sources without weights to prepare (test engines) bring their own tokenizer.
        self._engines = engines or EngineRegistry()
        # Tokenizers by model directory (or by source, for sources without weights);
        # shared tasks, so concurrent first requests read the files once.
        self._tokenizers: dict[str, asyncio.Task[PromptTokenizer]] = {}
        # What a deployment's ready weights gave, by (name, created at): a deployment's
        # weights never change, so later requests need no status read.
        self._ready: dict[tuple[str, float], ModelInfo] = {}

    async def info(self, spec: DeploymentSpec, wait_s: float) -> ModelInfo:
        """The model's tokenizer and context length, waiting up to `wait_s` for the
        weights; `CapacityError` (weights_preparing) when they are not ready by then,
        `WeightsError` when their preparation failed."""
        entry = self._engines.entry_for(spec.source)
        if not entry.prepares_weights:
            limits = self._limits
            tokenizer = await self._tokenizer(spec.source, lambda: entry.make_tokenizer(limits))
            return ModelInfo(tokenizer, spec.max_model_len or entry.context_len_of(spec.source))
        known = self._ready.get((spec.name, spec.created_at_s))
        if known is not None:
            return ModelInfo(known.tokenizer, spec.max_model_len or known.max_model_len)
        deadline_s = time.monotonic() + wait_s
        while True:
            weights = WeightsStatus.of(await self._state.deployment_status(spec.name))
            if weights.state is WeightsState.FAILED:
                raise WeightsError(weights.error, code=weights.error_code or None)
            if weights.state is WeightsState.READY and weights.path:
                loaded = await self._ready_tokenizer(spec, weights.path)
                if loaded is not None:
                    ready = ModelInfo(loaded, weights.max_model_len)
                    self._ready[(spec.name, spec.created_at_s)] = ready
                    return ModelInfo(loaded, spec.max_model_len or ready.max_model_len)
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                raise CapacityError(
                    f"The weights of {spec.name!r} are still being prepared; retry shortly.",
                    retry_after_s=5,
                    code=WEIGHTS_PREPARING,
                )
            await asyncio.sleep(min(_STATUS_POLL_S, remaining_s))

    def warm(self, spec: DeploymentSpec) -> None:
        """Read the tokenizer of a deployment in the background, as soon as its weights
        are ready (within `_WARM_WAIT_S`), so that its first request does not pay for it:
        ~0.1 s for a 49k-token vocabulary, before a cold start can even begin."""
        task = asyncio.create_task(self._warm(spec))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _warm(self, spec: DeploymentSpec) -> None:
        with contextlib.suppress(CapacityError, WeightsError):
            # Not ready by then, or failed: the first request waits, or hears why.
            await self.info(spec, wait_s=_WARM_WAIT_S)

    async def _ready_tokenizer(self, spec: DeploymentSpec, path: str) -> PromptTokenizer | None:
        if path in self._tokenizers or Path(path).is_dir():
            limits = self._limits
            return await self._tokenizer(path, lambda: HfPromptTokenizer.from_dir(path, limits))
        # The cache evicted the files since: ask the controller to prepare them again.
        log.warning("frontdoor: weights of %s gone from %s; asking for them", spec.name, path)
        await self._state.set_deployment_status(
            spec.name, **WeightsStatus(WeightsState.PREPARING).fields()
        )
        return None

    async def _tokenizer(self, key: str, load: Callable[[], PromptTokenizer]) -> PromptTokenizer:
        task = self._tokenizers.get(key)
        if task is None or (task.done() and task.exception() is not None):
            task = asyncio.create_task(asyncio.to_thread(load))
            self._tokenizers[key] = task
        return await asyncio.shield(task)
