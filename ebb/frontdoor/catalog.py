"""What the frontdoor must know of each deployment's model before admitting a request:
its tokenizer (to render chats, count and check prompt tokens) and its context length.

Weights are prepared (fetched or converted into the weight cache) once per source, in a
worker thread, when a deployment is created or first used; the deployment's status shows
the phase and fraction done (`weights_phase`, `weights_progress`). Requests that arrive
meanwhile wait for it within their admission window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from ebb.engines import EngineRegistry
from ebb.errors import CapacityError, WeightsError
from ebb.frontdoor.tokenizer import HfPromptTokenizer, PromptTokenizer
from ebb.queue.platform import PlatformState
from ebb.queue.schema import DeploymentSpec
from ebb.weights_cache import CacheOptions

log = logging.getLogger(__name__)

# How often preparation progress is written into the deployment's status.
_PROGRESS_PUSH_S = 0.25


@dataclass(frozen=True)
class ModelInfo:
    tokenizer: PromptTokenizer
    max_model_len: int


class _LatestProgress:
    """The newest (phase, fraction) a preparing thread reported; read by the event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: tuple[str, float] | None = None

    def update(self, phase: str, fraction: float) -> None:
        with self._lock:
            self._value = (phase, fraction)

    def take(self) -> tuple[str, float] | None:
        with self._lock:
            value, self._value = self._value, None
            return value


class ModelCatalog:
    def __init__(
        self,
        weights_dir: Path,
        state: PlatformState,
        options: CacheOptions | None = None,
        engines: EngineRegistry | None = None,
    ):
        self._weights_dir = weights_dir
        # Sources without weights to prepare (test engines) bring their own tokenizer.
        self._engines = engines or EngineRegistry()
        self._state = state
        self._options = options or CacheOptions()
        self._loading: dict[str, asyncio.Task[tuple[PromptTokenizer, int]]] = {}
        # Per source, the deployments (name, created at) whose status tells of its task.
        self._followers: dict[str, set[tuple[str, float]]] = {}
        self._background: set[asyncio.Task] = set()

    def prepare(self, spec: DeploymentSpec) -> asyncio.Task:
        """Start (or join) preparing the deployment's model; idempotent per source."""
        task = self._loading.get(spec.source)
        follower = (spec.name, spec.created_at_s)
        if task is None or (task.done() and task.exception() is not None):
            task = asyncio.create_task(self._load(spec))
            self._loading[spec.source] = task
            self._followers[spec.source] = {follower}
        elif follower not in self._followers[spec.source]:
            # Another deployment of a source already prepared (or being prepared): no
            # second preparation, but this one's status must say how that one goes.
            self._followers[spec.source].add(follower)
            joined = asyncio.create_task(self._follow(spec.name, task))
            self._background.add(joined)
            joined.add_done_callback(self._background.discard)
        return task

    async def _follow(self, name: str, task: asyncio.Task) -> None:
        if not task.done():
            await self._state.set_deployment_status(
                name, weights="preparing", weights_phase="", weights_progress=0
            )
        try:
            await asyncio.shield(task)
        except Exception as e:
            error = e.message if isinstance(e, WeightsError) else str(e)
            await self._state.set_deployment_status(name, weights="failed", weights_error=error)
            return
        await self._state.set_deployment_status(
            name, weights="ready", weights_error="", weights_progress=1
        )

    async def info(self, spec: DeploymentSpec, wait_s: float) -> ModelInfo:
        task = self.prepare(spec)
        try:
            tokenizer, model_len = await asyncio.wait_for(asyncio.shield(task), wait_s)
        except TimeoutError as e:
            raise CapacityError(
                f"The weights of {spec.name!r} are still being prepared; retry shortly.",
                retry_after_s=5,
                code="weights_preparing",
            ) from e
        return ModelInfo(tokenizer, spec.max_model_len or model_len)

    async def _load(self, spec: DeploymentSpec) -> tuple[PromptTokenizer, int]:
        entry = self._engines.entry_for(spec.source)
        if not entry.prepares_weights:
            return entry.make_tokenizer(), entry.context_len_of(spec.source)
        await self._state.set_deployment_status(
            spec.name, weights="preparing", weights_phase="", weights_progress=0
        )
        progress = _LatestProgress()
        pusher = asyncio.create_task(self._push_progress(spec.name, progress))
        try:
            result = await asyncio.to_thread(self._load_blocking, spec.source, progress.update)
        except WeightsError as e:
            await self._state.set_deployment_status(
                spec.name, weights="failed", weights_error=e.message
            )
            raise
        except Exception as e:
            log.exception("frontdoor: preparing %s failed", spec.source)
            await self._state.set_deployment_status(
                spec.name, weights="failed", weights_error=str(e)
            )
            raise WeightsError(f"Preparing the weights of {spec.name!r} failed: {e}") from e
        finally:
            pusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pusher  # no stale progress may land after the final status
        await self._state.set_deployment_status(
            spec.name, weights="ready", weights_error="", weights_progress=1
        )
        return result

    async def _push_progress(self, name: str, progress: _LatestProgress) -> None:
        while True:
            await asyncio.sleep(_PROGRESS_PUSH_S)
            latest = progress.take()
            if latest is not None:
                phase, fraction = latest
                await self._state.set_deployment_status(
                    name, weights_phase=phase, weights_progress=round(fraction, 4)
                )

    def _load_blocking(self, source: str, progress) -> tuple[PromptTokenizer, int]:
        from ebb.weights_cache import ensure, release

        # Held while the tokenizer is read, so an eviction cannot pull the files away.
        model = ensure(source, self._weights_dir, progress, options=self._options, hold=True)
        progress("tokenizer", 0.0)
        try:
            return HfPromptTokenizer.from_dir(model.path), model.max_model_len
        finally:
            release(model)
