"""GPU-time metering records on the GPU usage stream, and the script that writes them.

A runner's life, launch to exit, is cut into segments that never overlap and leave no
gap (lua/meter_gpu.lua keeps a `metered_ms` watermark in the runner's hash). Each segment
is billed to the attribution (`GpuMeter`) in force while it ran: the pre-warmed pool
before an assignment, the deployment's owning tenant after it. The ledger consumer's
hour closes are written on the same stream (`HourClosed`), so a replay books every
segment where the consumer booked it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Generic, Literal, TypeVar, cast, overload

import msgspec
import redis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript, Script

from ebb.queue import keys
from ebb.queue.scripts import lua_source

# The deployment a pre-warmed runner's time is billed to until it is assigned one.
POOL_DEPLOYMENT = "(pool)"
# Where a segment ends, from the runner's hash: its last heartbeat, its recorded exit, or
# its last sign of life (a runner killed before its first heartbeat ends where it was last
# seen: ready, or launched).
EndField = Literal["heartbeat_ms", "exited_ms", "heartbeat_ms,ready_ms,launched_ms"]
LAST_SIGN_OF_LIFE: EndField = "heartbeat_ms,ready_ms,launched_ms"


class GpuMeter(msgspec.Struct, kw_only=True, frozen=True):
    """Who a runner's GPU time is billed to, and at which price."""

    runner_id: str
    deployment: str  # POOL_DEPLOYMENT while a pre-warmed runner waits for an assignment
    tenant: str
    gpu_count: int = 1  # a CPU runner counts as one
    price_per_gpu_second_micros: int = 0


class GpuSegment(msgspec.Struct, kw_only=True, frozen=True):
    meter: GpuMeter
    start_ms: int
    end_ms: int
    # The runner's own milliseconds by use over this segment (ebb/billing/gpu_split.py),
    # proportions only; None when no runner accounted for it (the controller closed it).
    uses_ms: dict[str, int] | None = None

    @property
    def duration_ms(self) -> int:
        return self.end_ms - self.start_ms


class HourClosed(msgspec.Struct, kw_only=True, frozen=True):
    """Every hour before `closed_through_ms` is final; later arrivals book after it."""

    closed_through_ms: int


_meter_decoder = msgspec.json.Decoder(GpuMeter)
_uses_decoder = msgspec.json.Decoder(dict[str, int])


def decode_gpu_entry(fields: Mapping[bytes, bytes]) -> GpuSegment | HourClosed:
    """One entry of the GPU usage stream; raises ValueError when it is neither kind."""
    try:
        if b"c" in fields:
            return HourClosed(closed_through_ms=int(fields[b"c"]))
        return GpuSegment(
            meter=_meter_decoder.decode(fields[b"g"]),
            start_ms=int(fields[b"s"]),
            end_ms=int(fields[b"e"]),
            uses_ms=_uses_decoder.decode(fields[b"p"]) if b"p" in fields else None,
        )
    except (KeyError, msgspec.DecodeError) as e:
        raise ValueError(f"not a GPU usage entry: {dict(fields)!r}") from e


# The metered milliseconds (or -1/-2, see lua/meter_gpu.lua): an int from a blocking
# client, an awaitable of one from an asyncio client.
_Reply = TypeVar("_Reply", int, Awaitable[int])


class GpuMeterScript(Generic[_Reply]):
    """meter_gpu.lua bound to a client: a sync client returns results, an async one
    returns awaitables."""

    @overload
    def __init__(self: GpuMeterScript[int], client: redis.Redis) -> None: ...
    @overload
    def __init__(self: GpuMeterScript[Awaitable[int]], client: aioredis.Redis) -> None: ...
    def __init__(self, client: redis.Redis | aioredis.Redis) -> None:
        self._script: Script | AsyncScript = client.register_script(lua_source("meter_gpu"))

    def switch(
        self,
        runner_id: str,
        meter: GpuMeter,
        *,
        end: int | EndField,
        uses_ms: Mapping[str, int] | None = None,
    ) -> _Reply:
        """Bill the time up to `end` to the attribution so far, then bill to `meter`;
        `uses_ms`: the runner's account of that time by use (GpuSegment.uses_ms)."""
        return self._call(runner_id, end, meter, "switch", close=False, uses_ms=uses_ms)

    def close(
        self,
        runner_id: str,
        meter: GpuMeter,
        *,
        end: int | EndField,
        uses_ms: Mapping[str, int] | None = None,
    ) -> _Reply:
        """Bill the rest up to `end` and stop metering; `meter` is used only when the
        runner never stored an attribution of its own (it died before its first meter)."""
        return self._call(runner_id, end, meter, "fallback", close=True, uses_ms=uses_ms)

    def _call(
        self,
        runner_id: str,
        end: int | EndField,
        meter: GpuMeter,
        mode: Literal["switch", "fallback"],
        *,
        close: bool,
        uses_ms: Mapping[str, int] | None,
    ) -> _Reply:
        uses = msgspec.json.encode(dict(uses_ms)) if uses_ms else b""
        reply = self._script(
            keys=[keys.runner(runner_id), keys.GPU_USAGE],
            args=[end, msgspec.json.encode(meter), mode, "1" if close else "0", uses],
        )
        # The script answers an integer: as is from a blocking client, awaited from an
        # asyncio one; the overloads of __init__ tie _Reply to the client's kind.
        return cast(_Reply, reply)
