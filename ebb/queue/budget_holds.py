"""Budget holds: where each synchronous request's spend-cap reservation can be found until
it is settled, and which frontdoors are alive to settle theirs.

`lua/budget_reserve.lua` registers a request's reservation (`BudgetHoldRecord`: its
request id, amount, subjects and spend hashes, prices and owning frontdoor) in the same
script that charges it; `lua/budget_settle.lua` removes it in the script that settles it,
and settles nothing when it is already gone. Each frontdoor process renews an expiring
key of its own (`beat_frontdoor`) while it runs. The controller's reaper
(`ebb.coldstart.budget_reaper`) reads the holds here with what their requests became and
whether their owner still beats, and settles the ones left behind through
`BudgetStore.settle`.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.budget_schema import BudgetHoldRecord
from ebb.queue.replies import reply_text, reply_texts

# Holds read per page and pages per pass: a pass reads at most this many requests.
_PAGE = 256
_PAGES = 4


@dataclass(frozen=True)
class HeldRequest:
    """A hold with what its request is now. `state` is the request record's (None: there
    is none, it was never queued or has expired); the token counts are set only once a
    runner finished it (lua/finish.lua), which is when usage is billed."""

    hold: BudgetHoldRecord
    state: str | None
    error: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    owner_alive: bool


async def beat_frontdoor(client: aioredis.Redis, instance: str) -> None:
    """Say that frontdoor process `instance` is alive for the next FRONTDOOR_ALIVE_TTL_S."""
    await client.set(keys.frontdoor_alive(instance), "1", ex=keys.FRONTDOOR_ALIVE_TTL_S)


class BudgetHolds:
    def __init__(self, client: aioredis.Redis):
        self._redis = client

    async def held(self, *, older_than_s: float) -> list[HeldRequest]:
        """The holds registered more than `older_than_s` ago (Redis's clock), oldest first
        (at most _PAGE × _PAGES), with their requests and owners."""
        seconds, micros = await self._redis.time()
        cutoff_ms = int(seconds) * 1000 + int(micros) // 1000 - int(older_than_s * 1000)
        ids: list[str] = []
        for page in range(_PAGES):
            got = reply_texts(
                await self._redis.zrangebyscore(
                    keys.BUDGET_HOLDS_AT, "-inf", cutoff_ms, start=page * _PAGE, num=_PAGE
                )
            )
            ids += got
            if len(got) < _PAGE:
                break
        if not ids:
            return []
        return await self._with_requests(ids)

    async def _with_requests(self, ids: list[str]) -> list[HeldRequest]:
        raws = await self._redis.hmget(keys.BUDGET_HOLDS, ids)
        holds = [msgspec.json.decode(r, type=BudgetHoldRecord) for r in raws if r is not None]
        orphans = [i for i, r in zip(ids, raws, strict=True) if r is None]
        if orphans:  # settled between the two reads: its time is all that is left
            await self._redis.zrem(keys.BUDGET_HOLDS_AT, *orphans)
        owners = sorted({h.owner for h in holds})
        pipe = self._redis.pipeline(transaction=False)
        for h in holds:
            pipe.hmget(
                keys.request(h.request_id), "state", "error", "prompt_tokens", "completion_tokens"
            )
        for owner in owners:
            pipe.exists(keys.frontdoor_alive(owner))
        replies = await pipe.execute()
        alive = dict(zip(owners, (bool(n) for n in replies[len(holds) :]), strict=True))
        return [
            HeldRequest(
                hold=h,
                state=_text(fields[0]),
                error=_text(fields[1]),
                prompt_tokens=_int(fields[2]),
                completion_tokens=_int(fields[3]),
                owner_alive=alive[h.owner],
            )
            for h, fields in zip(holds, replies[: len(holds)], strict=True)
        ]

    async def redis_uptime_s(self) -> float:
        server = await self._redis.info("server")
        return float(server.get("uptime_in_seconds", 0))


def _text(raw: object) -> str | None:
    return None if raw is None else reply_text(raw)


def _int(raw: object) -> int | None:
    return None if raw is None else int(reply_text(raw))
