"""The frontdoor's FastAPI application: services, routers and the OpenAI error shape."""

from __future__ import annotations

import logging
import math
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ebb.config import Settings
from ebb.errors import CapacityError, EbbError, InvalidRequest, NotFound, RateLimited
from ebb.frontdoor import (
    routes_admin,
    routes_console,
    routes_deployments,
    routes_jobs,
    routes_limits,
    routes_openai,
    routes_status,
    routes_usage,
    routes_webhooks,
    routes_weights,
)
from ebb.frontdoor.services import build_services

log = logging.getLogger(__name__)


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        services = build_services(settings)
        app.state.services = services
        # Warm the tokenizers of existing deployments so first requests don't pay for it.
        for spec in await services.state.list_deployments():
            services.catalog.warm(spec)
        log.info("frontdoor: serving on %s", settings.base_url)
        yield
        await services.redis.aclose()

    app = FastAPI(title="ebb", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    app.include_router(routes_openai.router)
    app.include_router(routes_deployments.router)
    app.include_router(routes_usage.router)
    app.include_router(routes_limits.router)
    app.include_router(routes_admin.router)
    app.include_router(routes_jobs.router)
    app.include_router(routes_webhooks.router)
    app.include_router(routes_status.router)
    app.include_router(routes_console.router)
    app.include_router(routes_weights.router)
    _install_error_handlers(app)

    @app.middleware("http")
    async def count_requests(request: Request, call_next):
        response = await call_next(request)
        route = request.scope.get("route")
        services = getattr(request.app.state, "services", None)
        if services is not None:
            services.metrics.count(getattr(route, "path", "unmatched"), response.status_code)
        return response

    return app


def _error_response(error: EbbError) -> JSONResponse:
    headers = {"X-Request-Id": error.request_id} if error.request_id else {}
    if isinstance(error, CapacityError | RateLimited):
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
    return JSONResponse(error.to_body(), status_code=error.status_code, headers=headers)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(EbbError)
    async def ebb_error(request: Request, exc: EbbError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        message = first.get("msg", "invalid request")
        if first.get("type") == "extra_forbidden":
            message = f"Unrecognized request argument supplied: {param}"
        elif param:
            message = f"{param}: {message}"
        return _error_response(InvalidRequest(message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return _error_response(NotFound(f"No route {request.method} {request.url.path}."))
        error = EbbError(str(exc.detail))
        error.status_code = exc.status_code
        error.error_type = "invalid_request_error"
        return _error_response(error)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("frontdoor: unhandled error on %s", request.url.path)
        return _error_response(EbbError("Internal error; it has been logged."))
