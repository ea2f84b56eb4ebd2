"""What each tenant's stored files hold (count and bytes) against its caps, and when each
file expires: the Files API's Redis side (the content is in ebb.frontdoor.files' store).

A file's share is reserved (lua/file_reserve.lua) before its content is written and
given back (lua/file_release.lua) once it is deleted, whether by its owner or by the
retention sweep; both are atomic, so two uploads at a cap's edge cannot both pass and a
share is given back once however many frontdoors race to delete it.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis import asyncio as aioredis

from ebb.queue import keys
from ebb.queue.replies import reply_int, reply_list, reply_text, reply_texts
from ebb.queue.scripts import register_async


@dataclass(frozen=True)
class FileHoldings:
    """A tenant's stored files before a reservation; `refused_by` the cap it would pass
    ("count" or "bytes"), "" when it was granted."""

    files: int
    bytes: int
    refused_by: str = ""


@dataclass(frozen=True)
class ExpiredFile:
    file_id: str
    tenant: str


def _member(file_id: str, tenant: str) -> str:
    # File ids hold no space (ebb.frontdoor.files.new_file_id and batch output ids).
    return f"{file_id} {tenant}"


class FileQuotaStore:
    def __init__(self, client: aioredis.Redis):
        self.redis = client
        self._reserve = register_async(client, "file_reserve")
        self._release = register_async(client, "file_release")

    async def reserve(
        self,
        tenant: str,
        file_id: str,
        *,
        size_bytes: int,
        max_files: int,
        max_bytes: int,
        expires_at_s: int,
        force: bool = False,
    ) -> FileHoldings:
        """Hold `size_bytes` for `file_id` under `tenant`'s caps (`force`: past them)."""
        reply = reply_list(
            await self._reserve(
                keys=[keys.tenant_files(tenant), keys.tenant_file_bytes(tenant), keys.FILES_EXPIRY],
                args=[
                    file_id,
                    size_bytes,
                    max_files,
                    max_bytes,
                    expires_at_s,
                    _member(file_id, tenant),
                    "1" if force else "0",
                ],
            )
        )
        refused_by = "" if reply_int(reply[0]) else reply_text(reply[1])
        return FileHoldings(reply_int(reply[2]), reply_int(reply[3]), refused_by)

    async def release(self, tenant: str, file_id: str) -> bool:
        """Give back `file_id`'s share; True if it held one until now."""
        reply = await self._release(
            keys=[keys.tenant_files(tenant), keys.tenant_file_bytes(tenant), keys.FILES_EXPIRY],
            args=[file_id, _member(file_id, tenant)],
        )
        return bool(reply_int(reply))

    async def expire_now(self, tenant: str, file_id: str) -> None:
        """Mark a file due for the sweep (a delete under way: if its deleter dies between
        removing the content and giving back the share, the sweep finishes the job)."""
        await self.redis.zadd(keys.FILES_EXPIRY, {_member(file_id, tenant): 0}, xx=True)

    async def due(self, now_s: float, *, count: int) -> list[ExpiredFile]:
        """Up to `count` files whose retention ended by `now_s`, soonest first."""
        members = reply_texts(
            await self.redis.zrangebyscore(keys.FILES_EXPIRY, "-inf", now_s, start=0, num=count)
        )
        found = []
        for member in members:
            file_id, _, tenant = member.partition(" ")
            found.append(ExpiredFile(file_id, tenant))
        return found

    async def holdings(self, tenant: str) -> FileHoldings:
        files = await self.redis.hlen(keys.tenant_files(tenant))
        held = await self.redis.get(keys.tenant_file_bytes(tenant))
        return FileHoldings(int(files), int(held or 0))
