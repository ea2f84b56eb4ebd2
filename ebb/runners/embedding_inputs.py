"""Several embedding inputs in one work item, for the engine that embeds one prompt each.

A synchronous `/v1/embeddings` request queues one work item per input, so its inputs
spread over runners. An embeddings *job* (or Batch API line) is one job, hence one work
item: its inputs travel concatenated in `prompt_token_ids`, cut by
`SamplingSpec.embed_input_lengths`. `EmbeddingInputs` wraps the engine: it adds each input
as a request of its own (`<request id>/<i>`, so they share the engine's batch), and
reports them back as one request whose choice `i` is input `i`'s vector, finished when the
last input is, its prompt tokens the inputs' sum. Anything else passes straight through.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from ebb.queue.schema import ChoiceDelta, SamplingSpec
from ebb.runners.engine import (
    EngineAdapter,
    EngineRequestError,
    EngineStats,
    LoraAdapter,
    StepOutput,
)


def split_inputs(prompt_token_ids: list[int], lengths: list[int]) -> list[list[int]]:
    """The inputs a work item carries; EngineRequestError when the lengths do not fit."""
    if sum(lengths) != len(prompt_token_ids) or any(n < 1 for n in lengths):
        raise EngineRequestError(
            f"embed_input_lengths {lengths} do not cut a prompt of {len(prompt_token_ids)} tokens"
        )
    inputs, at = [], 0
    for n in lengths:
        inputs.append(prompt_token_ids[at : at + n])
        at += n
    return inputs


@dataclass
class _Group:
    parts: int
    prompt_tokens: dict[int, int] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)


class EmbeddingInputs:
    """An EngineAdapter around `engine` that serves multi-input embedding work items."""

    def __init__(self, engine: EngineAdapter):
        self._engine = engine
        self._groups: dict[str, _Group] = {}

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingSpec,
        continued: int = 0,
        priority: int = 1,
        lora: LoraAdapter | None = None,
        cache_salt: str = "",
    ) -> None:
        lengths = sampling.embed_input_lengths
        if not (sampling.embed and lengths):
            self._engine.add_request(
                request_id,
                prompt_token_ids,
                sampling,
                continued,
                priority=priority,
                lora=lora,
                cache_salt=cache_salt,
            )
            return
        inputs = split_inputs(prompt_token_ids, lengths)
        one = msgspec.structs.replace(sampling, embed_input_lengths=[])
        added: list[str] = []
        try:
            for i, ids in enumerate(inputs):
                self._engine.add_request(
                    f"{request_id}/{i}", ids, one, priority=priority, cache_salt=cache_salt
                )
                added.append(f"{request_id}/{i}")
        except EngineRequestError:
            self._engine.abort(added)  # all or none of its inputs run
            raise
        self._groups[request_id] = _Group(parts=len(inputs))

    def abort(self, request_ids: Iterable[str]) -> None:
        plain = []
        for request_id in request_ids:
            group = self._groups.pop(request_id, None)
            if group is None:
                plain.append(request_id)
            else:
                plain += [f"{request_id}/{i}" for i in range(group.parts) if i not in group.done]
        self._engine.abort(plain)

    def step(self) -> list[StepOutput]:
        results: list[StepOutput] = []
        merged: dict[str, list[ChoiceDelta]] = {}
        for out in self._engine.step():
            parent, _, part = out.request_id.rpartition("/")
            group = self._groups.get(parent) if parent else None
            if group is None:
                results.append(out)
                continue
            index = int(part)
            group.prompt_tokens[index] = out.prompt_tokens
            merged.setdefault(parent, []).extend(
                msgspec.structs.replace(c, index=index) for c in out.choices
            )
            if out.finished:
                group.done.add(index)
        for parent, choices in merged.items():
            group = self._groups[parent]
            finished = len(group.done) == group.parts
            if finished:
                del self._groups[parent]
            results.append(
                StepOutput(parent, choices, finished, sum(group.prompt_tokens.values()), 0)
            )
        return results

    def has_unfinished(self) -> bool:
        return self._engine.has_unfinished()

    def shutdown(self) -> None:
        self._engine.shutdown()

    def stats(self) -> EngineStats:
        return self._engine.stats()

    @property
    def supports_sleep(self) -> bool:
        return self._engine.supports_sleep

    @property
    def cpu_threads(self) -> int:
        return self._engine.cpu_threads

    def sleep(self) -> None:
        self._engine.sleep()

    def wake_up(self) -> None:
        self._engine.wake_up()
