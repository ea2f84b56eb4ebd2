"""The LoRA adapters a base's runner serves: from a work item's `AdapterRef` to the
engine's `LoraAdapter`.

An adapter reaches a runner with its first request: it is fetched and verified through
this host's weight cache (`ensure_adapter`, held while the runner keeps it), checked
against the base (rank, target modules, shapes; `ebb.weights_cache.adapters`) and given
an id the engine keeps it by. The engine loads it into its batch on first use and keeps
`max_cpu_loras` of them (LRU); this keeps the same account, so that it knows which
requests paid a cold load and which cached copies it may stop holding.

A request whose adapter cannot be served fails with the reason (`EngineRequestError`),
never the runner.

The runner's log is its base's owner's to read (`GET /v1/logs`), and an adapter may be
another tenant's: its log lines (and the weight cache's, while it loads one) name it by
its identity (`adapter_version_key`), never by its name or source.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebb.engine_options import LoraLimits
from ebb.errors import EbbError, WeightsError
from ebb.logs import redacting
from ebb.queue.schema import AdapterRef, WorkItem
from ebb.queue.versions import adapter_version_key, public_name
from ebb.runners.engine import EngineRequestError, LoraAdapter
from ebb.weights_cache import CacheOptions, LocalModel, parse_source, release
from ebb.weights_cache.adapters import (
    cached_base_config,
    check_against_base,
    ensure_adapter,
    read_adapter,
)
from ebb.weights_cache.store import entry_key

log = logging.getLogger(__name__)


class AdapterUnavailable(EngineRequestError):
    """The request's adapter cannot be served here (the client answer is a 400)."""

    code = "invalid_adapter"


@dataclass
class RunnerAdapters:
    """One runner's adapters. `limits`: its engine's LoRA limits (None: LoRA off);
    `base_source`: its model's source, whose cached config.json the shapes are checked
    against."""

    weights_dir: Path
    limits: LoraLimits | None
    base_source: str = ""
    cache_options: CacheOptions | None = None
    # adapter version key (`adapter_version_key`: versions share a uid, not files) ->
    # (what the engine gets, the held cache entry), least recent first.
    _kept: OrderedDict[str, tuple[LoraAdapter, LocalModel]] = field(default_factory=OrderedDict)
    _next_id: int = 1
    _base_config: dict[str, Any] | None = None
    cold_loads: int = 0
    # Told each cold load's adapter (its public name), and each adapter that could not be
    # served with the reason: the runner counts the first, shows the second as the
    # adapter deployment's status.
    on_cold_load: Callable[[str], None] | None = None
    on_failure: Callable[[str, str], None] | None = None

    def for_work(self, work: WorkItem) -> LoraAdapter | None:
        """The adapter `work` runs with (None: the base model); EngineRequestError with
        what to change when it cannot be served here."""
        ref = work.adapter
        if ref is None:
            return None
        if self.limits is None:
            raise AdapterUnavailable(
                f"the base runs without LoRA; deploy it with engine.enable_lora=true to "
                f"serve the adapter {public_name(ref.name)!r}"
            )
        key = adapter_version_key(ref)
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
            return kept[0]
        try:
            with redacting(_private_text(ref)):
                return self._load(ref, self.limits)
        except EngineRequestError as e:
            if self.on_failure is not None:
                self.on_failure(public_name(ref.name), str(e))
            raise

    def _load(self, ref: AdapterRef, limits: LoraLimits) -> LoraAdapter:
        name = public_name(ref.name)
        try:
            local = ensure_adapter(
                ref.source, self.weights_dir, options=self.cache_options, hold=True
            )
        except WeightsError as e:
            raise AdapterUnavailable(f"the adapter {name!r} cannot be served: {e.message}") from e
        try:
            check_against_base(read_adapter(local.path), self._config(), limits.max_lora_rank)
        except WeightsError as e:
            release(local)
            raise AdapterUnavailable(f"the adapter {name!r} cannot be served: {e.message}") from e
        # The engine gets the unit's name (`NAME@vN`): vLLM tells adapters apart by name.
        adapter = LoraAdapter(name=ref.name, int_id=self._next_id, path=local.path)
        self._next_id += 1
        self._kept[adapter_version_key(ref)] = (adapter, local)
        self.cold_loads += 1
        if self.on_cold_load is not None:
            self.on_cold_load(name)
        while len(self._kept) > limits.max_cpu_loras:
            dropped_key, (_, entry) = self._kept.popitem(last=False)
            release(entry)  # the engine dropped it too (same LRU, same bound)
            log.info("runner: adapter %s no longer kept (LRU)", dropped_key)
        log.info("runner: adapter %s ready", adapter_version_key(ref))
        return adapter

    def _config(self) -> dict[str, Any] | None:
        if self._base_config is None and self.base_source:
            self._base_config = cached_base_config(self.base_source, self.weights_dir)
        return self._base_config


def _private_text(ref: AdapterRef) -> dict[str, str]:
    """What of `ref` a log line must not show (its name, its source as given and as
    parsed), each shown as the adapter's identity instead."""
    shown = f"adapter {adapter_version_key(ref)}"
    private = {ref.source: shown, ref.name: shown, public_name(ref.name): shown}
    try:
        parsed = parse_source(ref.source)
    except EbbError:
        return private
    private[parsed.uri] = shown
    path = getattr(parsed, "path", None)
    if isinstance(path, str):
        private[path] = shown
    # The cache names its entry "<slug of the source's last part>-<digest>".
    slug = entry_key(parsed.uri, "", parsed.name).rpartition("-")[0]
    private[f"{slug}-"] = "adapter-"
    return private
