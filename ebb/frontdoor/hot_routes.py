"""The route class of the inference endpoints, the requests a burst is made of.

FastAPI runs every request of an `APIRoute` through its dependency solver, even for an
endpoint whose only parameter is the `Request` (it still parses query parameters, headers
and cookies against an empty list, and sets up background tasks): about a twentieth of
the frontdoor's CPU for a request refused because its queue is full. The inference
endpoints take the `Request`, authenticate with `auth.calling` and return a `Response`,
so a `RequestOnlyRoute` hands the request to them directly. They stay `APIRoute`s: the
OpenAPI document and the router's matching treat them as before.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from fastapi import Request, Response
from fastapi.routing import APIRoute


class RequestOnlyRoute(APIRoute):
    """An `APIRoute` whose endpoint is `async def endpoint(request: Request) -> Response`."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        parameters = list(inspect.signature(self.endpoint).parameters.values())
        if len(parameters) != 1 or self.dependencies:
            # Anything more would need the solver this class skips.
            raise TypeError(f"{self.path}: a RequestOnlyRoute's endpoint takes the request only")
        return self.endpoint
