"""Redis commands packed in one call into hiredis, for the asyncio clients.

redis-py packs each command through a Python generator that checks and encodes every
argument before handing the tuple to hiredis: about 1 us per argument, and the scripts an
admitted request runs (enqueue; a budget's reserve and settle) carry 10-20 each, so
packing was several percent of the frontdoor's CPU per request. hiredis encodes str
(UTF-8, strict), bytes, int and float itself, to the same bytes (floats by `repr`, as
redis-py does).

`with_fast_packing` gives a pool's connection class that fast path for commands whose
name is one word of letters (EVALSHA, HGETALL, XREAD...) and whose arguments are all
exactly str, bytes, int or float; a name of several words ("CLIENT UNBLOCK", which
redis-py splits) and any other argument (a bool, None, a bytearray, a subclass) take
redis-py's own packing, with its own result or error.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio.connection import AbstractConnection, ConnectionPool

_CLASSES: dict[type[AbstractConnection], type[AbstractConnection]] = {}


# Exactly these: redis-py writes a subclass by its repr (numpy's float64 by
# "np.float64(1.5)"), hiredis by its value; subclasses keep redis-py's way.
_HIREDIS_TYPES = frozenset((str, bytes, int, float))


class _FastPacking:
    def pack_command(self, *args: Any) -> list[bytes]:
        name = args[0] if args else None
        if isinstance(name, str) and name.isalpha() and _HIREDIS_TYPES.issuperset(map(type, args)):
            return [hiredis.pack_command(args)]
        packed: list[bytes] = super().pack_command(*args)  # type: ignore[misc]  # the connection class it is mixed into
        return packed


def with_fast_packing(pool: ConnectionPool) -> ConnectionPool:
    """`pool`, its connections (none made yet) packing commands by `_FastPacking`."""
    base = pool.connection_class
    if base not in _CLASSES:
        _CLASSES[base] = type(f"FastPacking{base.__name__}", (_FastPacking, base), {})
    pool.connection_class = _CLASSES[base]
    return pool
