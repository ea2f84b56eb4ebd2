"""What each node's weight cache holds, as its prefetcher (`ebb prefetch`) last published
it: placement's evidence that a runner landing there skips the fetch.

An entry names its own expiry: a node whose prefetcher stopped publishing (the node is
gone, the DaemonSet removed) stops counting as holding anything once it passes.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
import redis
import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.replies import reply_hash


class NodeCache(msgspec.Struct, kw_only=True, frozen=True):
    node: str
    sources: list[str]
    published_ms: int
    expires_ms: int


_decode = msgspec.json.Decoder(NodeCache)


def publish_node_cache(
    client: redis.Redis, node: str, sources: Iterable[str], *, now_ms: int, ttl_ms: int
) -> None:
    entry = NodeCache(
        node=node, sources=sorted(set(sources)), published_ms=now_ms, expires_ms=now_ms + ttl_ms
    )
    client.hset(keys.NODE_CACHES, node, msgspec.json.encode(entry))


def _fresh(raw: dict[bytes, bytes], now_ms: int) -> dict[str, frozenset[str]]:
    found = {}
    for value in raw.values():
        try:
            entry = _decode.decode(value)
        except msgspec.DecodeError:
            continue  # written by another version: no evidence either way
        if entry.expires_ms > now_ms:
            found[entry.node] = frozenset(entry.sources)
    return found


def read_node_caches(client: redis.Redis, *, now_ms: int) -> dict[str, frozenset[str]]:
    """{node: sources its cache holds} of every node whose entry has not expired."""
    return _fresh(reply_hash(client.hgetall(keys.NODE_CACHES)), now_ms)


async def read_node_caches_async(
    client: aioredis.Redis, *, now_ms: int
) -> dict[str, frozenset[str]]:
    return _fresh(reply_hash(await client.hgetall(keys.NODE_CACHES)), now_ms)
