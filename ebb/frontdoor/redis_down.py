"""Redis unreachable ⇒ 503 with Retry-After in the OpenAI error shape, on every route.

The frontdoor keeps no state of its own: without Redis it can neither authenticate,
admit nor follow a request, so any route that needs Redis while it is down (restarting,
loading its append-only file) answers "unavailable, retry shortly" instead of 500.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ebb.errors import CapacityError, EbbError
from ebb.queue.connection import UNAVAILABLE_ERRORS

log = logging.getLogger(__name__)


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
