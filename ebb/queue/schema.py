"""Typed messages that cross process boundaries through Redis (msgspec, never pickle).

The frontdoor writes a `WorkItem` into a deployment's queue; the runner that claims it
answers on the request's output stream with `RequestEvent`s: `Claimed`, then `Progress`
deltas, then exactly one terminal event, `Finished` or `Failed`.
"""

from __future__ import annotations

from typing import Literal

import msgspec


class SamplingSpec(msgspec.Struct, kw_only=True, frozen=True):
    """Engine-neutral sampling parameters, already validated by the frontdoor."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: list[str] = []
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # None: no logprobs. k >= 0: the sampled token's logprob plus the k most likely ones.
    logprobs: int | None = None
    # Structured output: a JSON schema, or any JSON object when json_object is set.
    json_schema: dict | None = None
    json_object: bool = False


class WorkItem(msgspec.Struct, kw_only=True, frozen=True):
    request_id: str
    deployment: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec
    tenant: str = "admin"
    enqueued_at_s: float = 0.0


class TopLogprob(msgspec.Struct, frozen=True):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(msgspec.Struct, frozen=True):
    token: str
    logprob: float
    bytes: list[int]
    top: list[TopLogprob] = []


FinishReason = Literal["stop", "length"]


class ChoiceDelta(msgspec.Struct, kw_only=True, frozen=True):
    """New output of one choice since the previous delta."""

    index: int
    text: str
    token_count: int
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None


class Claimed(msgspec.Struct, tag="claimed", frozen=True):
    runner_id: str


class Progress(msgspec.Struct, tag="progress", frozen=True):
    choices: list[ChoiceDelta]


class Finished(msgspec.Struct, tag="finished", frozen=True):
    prompt_tokens: int
    completion_tokens: int


class Failed(msgspec.Struct, tag="failed", frozen=True):
    message: str
    # One of ebb.errors' codes, e.g. "runner_lost", "engine_error", "cancelled".
    code: str
    retryable: bool = False


RequestEvent = Claimed | Progress | Finished | Failed

_event_decoder = msgspec.json.Decoder(RequestEvent)
_work_decoder = msgspec.json.Decoder(WorkItem)
_encoder = msgspec.json.Encoder()


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode_event(data: bytes) -> RequestEvent:
    return _event_decoder.decode(data)


def decode_work(data: bytes) -> WorkItem:
    return _work_decoder.decode(data)
