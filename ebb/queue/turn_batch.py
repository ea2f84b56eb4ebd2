"""Commands sent in one turn of the event loop go to Redis together, as one pipeline.

Each admitted request runs a few commands of its own (its enqueue script, above all),
and every command sent alone costs its round trip: a socket write and a wake-up for the
reply, on both sides, which on this machine cost more of the frontdoor's CPU than the
Python around them. Requests that the loop resumes together (a burst's arrivals, the
answers of one shared XREAD) send theirs in the same turn; here they share one pipeline,
sent on the loop's next turn (no waiting beyond that). Each caller gets its own
command's reply or error, as if it had sent it alone; a failed round trip fails every
command in it, as it would have failed each of them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis

# What Redis accepts as a command's word (as ebb.queue.scripts' Arg).
Arg = str | bytes | int | float


class TurnBatch:
    def __init__(self, client: aioredis.Redis):
        self._client = client
        self._pending: list[tuple[tuple[Arg, ...], asyncio.Future[Any]]] = []
        # The loop keeps only weak references to tasks: these keep each send alive.
        self._sending: set[asyncio.Task[None]] = set()

    async def execute(self, *command: Arg) -> Any:
        """`command`'s reply (raises its error), sent with the others of this turn."""
        loop = asyncio.get_running_loop()
        if not self._pending:
            loop.call_soon(self._flush)
        reply: asyncio.Future[Any] = loop.create_future()
        self._pending.append((command, reply))
        return await reply

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.ensure_future(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[tuple[Arg, ...], asyncio.Future[Any]]]) -> None:
        try:
            if len(batch) == 1:
                command = batch[0][0]
                replies: list[Any] = [await self._client.execute_command(*command)]  # type: ignore[no-untyped-call]  # redis-py's
            else:
                pipe = self._client.pipeline(transaction=False)
                for command, _ in batch:
                    pipe.execute_command(*command)
                replies = await pipe.execute(raise_on_error=False)
        except Exception as e:  # the round trip failed: so did every command in it
            replies = [e] * len(batch)
        for (_, reply), value in zip(batch, replies, strict=True):
            if reply.done():  # its caller was cancelled
                continue
            if isinstance(value, Exception):
                reply.set_exception(value)
            else:
                reply.set_result(value)
