"""What a streamed request's SSE rendering needs besides its events, kept for resumes.

A client whose connection broke mid-stream (its frontdoor was killed) reconnects to any
frontdoor with the request id; that frontdoor replays the request's event stream through
the same `ResponseBuilder` the first one used, which it builds from this record: the
chunks it renders, ids and `created` included, are then byte for byte the ones the first
frontdoor sent. One key per request under its tenant (keys.stream_view), written once at
admission by the frontdoor, so no script is needed; it goes out with the other commands
of its loop turn when the frontdoor gives a `batch` (`ebb.queue.turn_batch`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from ebb.queue import keys
from ebb.queue.schema import ToolCallFormat

if TYPE_CHECKING:  # the struct is the protocol modules' too (ebb.openai.translate): no I/O
    import redis.asyncio as aioredis

    from ebb.queue.scripts import TurnBatchLike


class StreamView(msgspec.Struct, kw_only=True, frozen=True):
    """A streamed request's rendering, as its frontdoor built it: the chat or completions
    chunks of `kind`, which a Responses API stream (`response` set) turns into its events."""

    tenant: str
    kind: str  # ebb.openai.response_builder.EndpointKind's value
    model: str
    created_s: int
    n: int
    include_usage: bool = False
    continuous_usage_prompt_tokens: int | None = None
    logprobs: bool = False
    tools: ToolCallFormat | None = None
    # A Responses API stream: its Response object as created (what its events frame).
    response: dict[str, Any] | None = None


_decoder = msgspec.json.Decoder(StreamView)


class StreamViews:
    def __init__(self, client: aioredis.Redis, *, ttl_s: int, batch: TurnBatchLike | None = None):
        self._redis = client
        self._ttl_s = ttl_s
        self._batch = batch

    async def put(self, request_id: str, view: StreamView) -> None:
        """Keep `view` as long as the request's record (its events expire sooner)."""
        key = keys.stream_view(view.tenant, request_id)
        if self._batch is not None:
            await self._batch.execute("SET", key, msgspec.json.encode(view), "EX", self._ttl_s)
        else:
            await self._redis.set(key, msgspec.json.encode(view), ex=self._ttl_s)

    async def get(self, tenant: str, request_id: str) -> StreamView | None:
        """`tenant`'s view of `request_id`; None when it is another tenant's or expired."""
        raw = await self._redis.get(keys.stream_view(tenant, request_id))
        return None if raw is None else _decoder.decode(raw)

    async def has_events(self, request_id: str) -> bool:
        """Whether the request's event stream is still kept (it expires after it ended)."""
        return bool(await self._redis.exists(keys.events(request_id)))
