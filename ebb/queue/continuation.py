"""Continuation by token replay: what a runner that claims a continued request resumes from.

A request whose runner was lost (reap.lua) or that its runner gave back (job_yield.lua)
is queued again with its events stream intact and a `Continued` event on it. The runner
that claims it reads the stream as every other reader does (`RepeatFilter`), replays the
token ids of the output so far after the prompt, and generates only the rest: its Progress
events carry on from the next token, and its usage counts the prompt once and every token
delivered. Only a single-choice generation whose deltas all carry their token ids can be
replayed, and only without structured output (guided decoding would start its grammar
over at the replayed tokens); any other output so far makes the loss the request's answer.
reap.lua and job_yield's caller apply the same rule (`replayable`) before queueing one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from ebb.queue.requests import RepeatFilter
from ebb.queue.schema import Continued, FinishReason, Progress, RequestEvent, SamplingSpec


@dataclass(frozen=True)
class OutputSoFar:
    """The output a request's stream holds, as its readers saw it."""

    token_ids: list[int] = field(default_factory=list)
    completion_tokens: int = 0
    attempt: int = 0  # the last Continued event's: the attempt the next output belongs to
    finish_reason: FinishReason | None = None  # the output already ended (with this reason)
    replayable: bool = True


def replayable(sampling: SamplingSpec) -> bool:
    """Whether a continuation can go on with this request's output (see reap.lua)."""
    guided = sampling.json_schema is not None or sampling.json_object or sampling.structural_tag
    return sampling.n == 1 and not sampling.embed and not guided


def output_so_far(events: Iterable[RequestEvent]) -> OutputSoFar:
    """The output in `events` (a request's stream, in order), kept as readers keep it."""
    repeats = RepeatFilter()
    token_ids: list[int] = []
    completion = attempt = 0
    finish: FinishReason | None = None
    replayable = True
    for event in events:
        if not repeats.keep(event):
            continue
        if isinstance(event, Continued):
            attempt = event.attempt
        elif isinstance(event, Progress):
            for choice in event.choices:
                replayable &= choice.index == 0 and choice.embedding is None
                # A delta that ends the output may count a token it does not show (a stop
                # string's); nothing follows it, so nothing needs replaying.
                if len(choice.token_ids) != choice.token_count and not choice.finish_reason:
                    replayable = False
                token_ids.extend(choice.token_ids)
                completion += choice.token_count
                finish = finish or choice.finish_reason
    return OutputSoFar(token_ids, completion, attempt, finish, replayable)


def remaining_sampling(sampling: SamplingSpec, so_far: OutputSoFar) -> SamplingSpec:
    """`sampling` for the rest of the output: the tokens left of max_tokens (and of
    min_tokens); the same seed and every other parameter."""
    done = so_far.completion_tokens
    return msgspec.structs.replace(
        sampling,
        max_tokens=sampling.max_tokens - done,
        min_tokens=max(0, sampling.min_tokens - done),
    )
