"""Stored responses of the Responses API (`store`), one expiring key per response, under
per-tenant caps.

A response keeps only its own turn: the items it was given and its Response object (its
output). The earlier turns of a `previous_response_id` chain are read from their own
records (`chain` names them, oldest first), so a conversation of n turns is stored once,
not n times over. Keys live under their tenant (keys.stored_response): a response is
found only by the tenant that created it.

The caps (count and bytes per tenant) are kept in the tenant's index and size hash: room
is taken atomically before a response runs (`reserve`, response_reserve.lua), the stored
record's real size counted when it is written (response_put.lua), and given back when it
is deleted (response_delete.lua) or expires (each script forgets expired entries first).
"""

from __future__ import annotations

from typing import Any

import msgspec
import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.replies import reply_int, reply_list
from ebb.queue.scripts import register_async

# Room held for a response not stored yet: one that failed or whose stream broke never
# writes its record, and gives its room back after this long (a longer one re-counts).
RESERVE_S = 3600
# Expired entries each script forgets at most (more wait for the next call).
_PRUNE_MAX = 256


class StoredResponse(msgspec.Struct, kw_only=True):
    tenant: str
    # The Response object as GET shows it.
    response: dict[str, Any]
    # The items this response was given (each with an id).
    input_items: list[dict[str, Any]] = []
    # The responses before it in its previous_response_id chain, oldest first: a next
    # turn continues from their turns, then this one's.
    chain: list[str] = []
    # Only in records written before chains: the whole conversation before this one.
    context_items: list[dict[str, Any]] = []
    # A background response runs as this job; "" for the others.
    job_id: str = ""

    def conversation(self) -> list[dict[str, Any]]:
        """This record's items a follow-up continues from: input, then output (after the
        conversation an old record kept)."""
        return [*self.context_items, *self.input_items, *self.response.get("output", [])]


class CapUse(msgspec.Struct, frozen=True):
    """What a tenant held when its new response was refused."""

    count: int
    size_bytes: int


_decoder = msgspec.json.Decoder(StoredResponse)


class ResponseStore:
    def __init__(self, client: aioredis.Redis, *, retention_s: int, max_count: int, max_bytes: int):
        self.redis = client
        self.retention_s = retention_s
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._reserve = register_async(client, "response_reserve")
        self._put = register_async(client, "response_put")
        self._delete = register_async(client, "response_delete")

    async def reserve(self, tenant: str, response_id: str, *, size_bytes: int) -> CapUse | None:
        """Hold room for a new response of about `size_bytes`; None when held, or what
        the tenant holds when that would pass one of its caps."""
        reply = reply_list(
            await self._reserve(
                keys=_index_keys(tenant),
                args=[
                    response_id,
                    RESERVE_S,
                    size_bytes,
                    self.max_count,
                    self.max_bytes,
                    _PRUNE_MAX,
                ],
            )
        )
        if reply_int(reply[0]):
            return None
        return CapUse(reply_int(reply[1]), reply_int(reply[2]))

    async def put(self, record: StoredResponse, *, keep_ttl: bool = False) -> bool:
        """Store (or replace) a response; `keep_ttl` keeps the expiry of the first write
        and stores nothing if the record is gone (False then)."""
        response_id = record.response["id"]
        reply = await self._put(
            keys=[keys.stored_response(record.tenant, response_id), *_index_keys(record.tenant)],
            args=[
                response_id,
                msgspec.json.encode(record),
                0 if keep_ttl else self.retention_s,
                _PRUNE_MAX,
            ],
        )
        return bool(reply_int(reply))

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        raw = await self.redis.get(keys.stored_response(tenant, response_id))
        return None if raw is None else _decoder.decode(raw)

    async def get_many(self, tenant: str, response_ids: list[str]) -> list[StoredResponse | None]:
        """The records of `response_ids` in order, None for each one gone; one read."""
        if not response_ids:
            return []
        raws = await self.redis.mget([keys.stored_response(tenant, i) for i in response_ids])
        return [None if raw is None else _decoder.decode(raw) for raw in raws]

    async def delete(self, tenant: str, response_id: str) -> bool:
        """Forget a response, or the room held for one never stored; its share of the
        caps is given back. True when a record was deleted."""
        reply = await self._delete(
            keys=[keys.stored_response(tenant, response_id), *_index_keys(tenant)],
            args=[response_id],
        )
        return bool(reply_int(reply))


def _index_keys(tenant: str) -> list[str]:
    return [keys.tenant_responses(tenant), keys.tenant_response_bytes(tenant)]
