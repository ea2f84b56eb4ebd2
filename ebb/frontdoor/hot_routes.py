"""The inference endpoints' way in: what a burst's requests pass through, and no more.

FastAPI runs every request of an `APIRoute` through its dependency solver, even for an
endpoint whose only parameter is the `Request` (it still parses query parameters, headers
and cookies against an empty list, and sets up background tasks): about a twentieth of
the frontdoor's CPU for a request refused because its queue is full. The inference
endpoints take the `Request`, authenticate with `auth.calling` and return a `Response`,
so a `RequestOnlyRoute` hands the request to them directly. They stay `APIRoute`s: the
OpenAPI document and the router's matching treat them as before.

Before a request reaches a route, it passes FastAPI's exit-stack middleware (for
dependencies with `yield`, which these endpoints have none of), the router's walk through
every route's path pattern, and the route's own wrapper (two more exit stacks and a
second exception-handling layer): an eighth of the app's CPU for a refused request (215
-> 190 us per request, driven in-process). `InferenceShortcut` sits just inside
Starlette's `ExceptionMiddleware` and hands a POST to one of these paths straight to its
endpoint, setting in the scope what the router would have (`route`, `endpoint`,
`path_params`, `router`). Whatever the endpoint raises meets the app's exception
handlers exactly as before: they live in the `ExceptionMiddleware` around it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.routing import APIRoute, APIRouter
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send


class RequestOnlyRoute(APIRoute):
    """An `APIRoute` whose endpoint is `async def endpoint(request: Request) -> Response`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        parameters = list(inspect.signature(self.endpoint).parameters.values())
        if len(parameters) != 1 or self.dependencies:
            # Anything more would need the solver this class skips.
            raise TypeError(f"{self.path}: a RequestOnlyRoute's endpoint takes the request only")
        return self.endpoint


class InferenceShortcut:
    """POSTs to a `RequestOnlyRoute`'s path go to its endpoint; everything else to `app`."""

    def __init__(self, app: ASGIApp, router: APIRouter):
        self.app = app
        self._router = router
        # Paths without parameters only: those are matched by equality, as the router
        # would match them (the inference paths have none).
        self._routes = {
            route.path: route
            for route in router.routes
            if isinstance(route, RequestOnlyRoute)
            and "POST" in route.methods
            and not route.param_convertors
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = None
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            route = self._routes.get(scope["path"])
        if route is None:
            await self.app(scope, receive, send)
            return
        scope["router"] = self._router
        scope["route"] = route
        scope["endpoint"] = route.endpoint
        scope["path_params"] = {}
        response = await route.endpoint(Request(scope, receive, send))
        await response(scope, receive, send)


class ShortcutFastAPI(FastAPI):
    """FastAPI with `InferenceShortcut` just inside its exception handling."""

    def build_middleware_stack(self) -> ASGIApp:
        outermost = super().build_middleware_stack()
        layer = outermost
        while not isinstance(layer, ExceptionMiddleware):
            layer = layer.app  # type: ignore[attr-defined]  # each middleware wraps `app`
        layer.app = InferenceShortcut(layer.app, self.router)
        return outermost
