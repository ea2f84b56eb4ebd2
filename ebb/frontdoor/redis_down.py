"""Redis unreachable ⇒ 503 with Retry-After in the OpenAI error shape, on every route.

The frontdoor keeps no state of its own: without Redis it can neither authenticate,
admit nor follow a request, so any route that needs Redis while it is down (restarting,
loading its append-only file) answers "unavailable, retry shortly" instead of 500.
Routes that accept async work (`ride_out`) first wait out a short outage, so that a
submission made while Redis restarts is accepted rather than refused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ebb import backoff
from ebb.errors import CapacityError, EbbError
from ebb.queue.connection import UNAVAILABLE_ERRORS

log = logging.getLogger(__name__)
T = TypeVar("T")

_RIDE_OUT_FIRST_S = 0.1
_RIDE_OUT_MAX_S = 2.0


class RedisUnavailable(CapacityError):
    code = "redis_unavailable"


def unavailable(retry_after_s: float) -> RedisUnavailable:
    return RedisUnavailable(
        "The platform's state store (Redis) is unreachable right now, most likely "
        "restarting; nothing was done. Retry after the indicated time.",
        retry_after_s=retry_after_s,
    )


def install(app: FastAPI, retry_after_s: float, render: Callable[[EbbError], JSONResponse]) -> None:
    """Register the handler; `render` turns an EbbError into the app's JSON response."""

    async def redis_down(request: Request, exc: Exception) -> JSONResponse:
        log.warning("frontdoor: Redis unavailable on %s: %s", request.url.path, exc)
        return render(unavailable(retry_after_s))

    for error in UNAVAILABLE_ERRORS:
        app.add_exception_handler(error, redis_down)


async def ride_out(call: Callable[[], Awaitable[T]], outage_s: float) -> T:
    """`call()`, called again with backoff while Redis is unreachable, for at most
    `outage_s` (EBB_REDIS_OUTAGE_S); then the unavailability propagates (a 503 through
    the handler above). `call` must be safe to repeat: it may have been applied when its
    reply was lost."""
    deadline = time.monotonic() + outage_s
    failures = 0
    while True:
        try:
            return await call()
        except UNAVAILABLE_ERRORS as e:
            failures += 1
            delay_s = backoff.delay_s(failures, first_s=_RIDE_OUT_FIRST_S, cap_s=_RIDE_OUT_MAX_S)
            if time.monotonic() + delay_s > deadline:
                raise
            log.warning("frontdoor: Redis unavailable (%s); retrying in %.1fs", e, delay_s)
            await asyncio.sleep(delay_s)
