"""Which model sources the platform serves, and how each part of it serves them.

An `EngineEntry` describes one family of deployment sources, chosen by URI scheme:
- the frontdoor validates a source with it when a deployment is created (`validate`,
  raising `InvalidRequest`: a 400 that says what to change);
- `prepares_weights` says whether the source has weights to prepare in the weight cache.
  If it has, the frontdoor's tokenizer and the context length come from the prepared
  weights (`HfPromptTokenizer`, the weight cache's `max_model_len`); if not, from the
  entry's `tokenizer` factory and `context_len`;
- a runner builds the engine with `preload` (import its libraries) and `engine`.

Every callable is named by a "module:attribute" path and imported only when it is
called, so reading the registry imports nothing heavy (vLLM, torch), and no package
imports one it must not: the frontdoor resolves sources here without importing
`ebb.runners` or `ebb.testing`.

The default entry serves every source the weight cache accepts with vLLM. Test entries
(the fake engine in `ebb.testing`) exist only when `Settings.test_engines` is on
(`EBB_TEST_ENGINES=1`, which the test session sets for every process it starts); without
it their schemes get the same 400 as any unknown scheme.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ebb.config import Settings

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
# Where the test entries are declared; imported only when test engines are on.
TEST_ENTRIES_PATH = "ebb.testing:ENGINE_ENTRIES"


def load_object(path: str) -> Any:
    """The object a "package.module:attr.attr" path names, importing its module now."""
    module_name, _, attributes = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for attribute in filter(None, attributes.split(".")):
        obj = getattr(obj, attribute)
    return obj


@dataclass(frozen=True)
class EngineEntry:
    """One family of sources and the engine that serves it (paths: see the module doc).

    Contracts of the named callables:
    - `validate(source) -> object`: raises `InvalidRequest` (param "source") when the
      source is malformed; its return value is ignored.
    - `engine(options: EngineOptions) -> EngineAdapter`: loads the engine in a runner;
      `options.source` is the deployment's source, `options.model_path` the prepared
      weights (None when the entry prepares none).
    - `preload() -> None`: imports the engine's libraries; idempotent.
    - `tokenizer(limits: TemplateLimits | None) -> PromptTokenizer` (the chat templates' render
      budget, `ebb.openai.template_budget`) and `context_len(source) -> int`: set exactly when
      `prepares_weights` is False.
    - `memory_need(source) -> int`: the GPU bytes a runner needs, for an entry without
      prepared weights to estimate it from (None: estimated from the weights).
    """

    name: str
    schemes: tuple[str, ...]
    validate: str
    engine: str
    prepares_weights: bool = True
    preload: str | None = None
    tokenizer: str | None = None
    context_len: str | None = None
    memory_need: str | None = None

    def __post_init__(self) -> None:
        own = [self.tokenizer is not None, self.context_len is not None]
        if own != [not self.prepares_weights] * 2:
            raise ValueError(
                f"engine entry {self.name!r}: tokenizer and context_len are set exactly "
                "when it prepares no weights"
            )

    def check(self, source: str) -> None:
        load_object(self.validate)(source)

    def preload_engine(self) -> bool:
        """Import the engine's libraries now; False when the entry has none to import."""
        if self.preload is None:
            return False
        load_object(self.preload)()
        return True

    def load_engine(self, options: Any) -> Any:
        """The engine for `options` (an `EngineAdapter`), built in this process."""
        return load_object(self.engine)(options)

    def make_tokenizer(self, limits: Any = None) -> Any:
        if self.tokenizer is None:
            raise ValueError(f"{self.name}: the tokenizer comes with the prepared weights")
        return load_object(self.tokenizer)(limits)

    def memory_need_of(self, source: str) -> int | None:
        """The GPU bytes the entry says a runner of `source` needs; None: not its to say."""
        if self.memory_need is None:
            return None
        return int(load_object(self.memory_need)(source))

    def context_len_of(self, source: str) -> int:
        if self.context_len is None:
            raise ValueError(f"{self.name}: the context length comes with the prepared weights")
        return int(load_object(self.context_len)(source))


# Every source the weight cache accepts (`ebb.weights_cache.sources`), served by vLLM.
VLLM = EngineEntry(
    name="vllm",
    schemes=(),
    validate="ebb.weights_cache.sources:parse_source",
    engine="ebb.runners.engine_vllm:VllmEngine.load",
    preload="ebb.runners.engine_vllm:preload",
)


class EngineRegistry:
    """The entries one process serves: `default` for every scheme no other entry claims."""

    def __init__(self, entries: Iterable[EngineEntry] = (), default: EngineEntry = VLLM):
        self.default = default
        self._by_scheme: dict[str, EngineEntry] = {}
        for entry in entries:
            for scheme in map(str.lower, entry.schemes):
                if scheme in self._by_scheme:
                    raise ValueError(f"two engine entries claim the scheme {scheme!r}")
                self._by_scheme[scheme] = entry

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineRegistry:
        """The production entries, plus the test entries when `settings.test_engines`."""
        entries = load_object(TEST_ENTRIES_PATH) if settings.test_engines else ()
        return cls(entries)

    def entry_for(self, source: str) -> EngineEntry:
        """The entry serving `source` (the default one for unknown schemes: it refuses them)."""
        match = _SCHEME_RE.match(source)
        scheme = match.group(1).lower() if match else ""
        return self._by_scheme.get(scheme, self.default)

    def validate(self, source: str) -> EngineEntry:
        """The entry serving `source`, once it accepted it; `InvalidRequest` otherwise."""
        entry = self.entry_for(source)
        entry.check(source)
        return entry
