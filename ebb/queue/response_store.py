"""Stored responses of the Responses API (`store`), one expiring key per response.

A response is written whole when it is created and again when it settles (a background
one, or a stream once it ends); only the frontdoor writes it and each write replaces one
key, so no script is needed. Keys live under their tenant (keys.stored_response): a
response is found only by the tenant that created it.
"""

from __future__ import annotations

from typing import Any

import msgspec
import redis.asyncio as aioredis

from ebb.queue import keys


class StoredResponse(msgspec.Struct, kw_only=True):
    tenant: str
    # The Response object as GET shows it.
    response: dict[str, Any]
    # The items this response was given (each with an id), and the conversation before
    # them (the previous responses' input and output items, oldest first): what a next
    # turn's previous_response_id continues from.
    input_items: list[dict[str, Any]] = []
    context_items: list[dict[str, Any]] = []
    # A background response runs as this job; "" for the others.
    job_id: str = ""

    def conversation(self) -> list[dict[str, Any]]:
        """Every item a follow-up continues from: context, input, then output."""
        return [*self.context_items, *self.input_items, *self.response.get("output", [])]


_decoder = msgspec.json.Decoder(StoredResponse)


class ResponseStore:
    def __init__(self, client: aioredis.Redis, *, retention_s: int):
        self.redis = client
        self.retention_s = retention_s

    async def put(self, record: StoredResponse, *, keep_ttl: bool = False) -> None:
        """Store (or replace) a response; `keep_ttl` keeps the expiry of the first write."""
        key = keys.stored_response(record.tenant, record.response["id"])
        data = msgspec.json.encode(record)
        if keep_ttl:
            await self.redis.set(key, data, keepttl=True, xx=True)
        else:
            await self.redis.set(key, data, ex=self.retention_s)

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        raw = await self.redis.get(keys.stored_response(tenant, response_id))
        return None if raw is None else _decoder.decode(raw)

    async def delete(self, tenant: str, response_id: str) -> bool:
        return bool(await self.redis.delete(keys.stored_response(tenant, response_id)))
