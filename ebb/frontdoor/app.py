"""The frontdoor's FastAPI application: services, routers and the OpenAI error shape."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ebb.config import Settings
from ebb.console import routes as console_routes
from ebb.errors import EbbError
from ebb.frontdoor import (
    batch_queueing,
    file_keeping,
    parked_jobs,
    redis_down,
    routes_admin,
    routes_apidocs,
    routes_batches,
    routes_budgets,
    routes_deployments,
    routes_embeddings,
    routes_files,
    routes_jobs,
    routes_jobs_read,
    routes_limits,
    routes_logs,
    routes_openai,
    routes_quotas,
    routes_responses,
    routes_resume,
    routes_status,
    routes_tokenize,
    routes_usage,
    routes_versions,
    routes_webhooks,
    routes_weights,
)
from ebb.frontdoor.body import BodyGuard
from ebb.frontdoor.errors_http import error_response, install_input_error_handlers
from ebb.frontdoor.hot_routes import ShortcutFastAPI
from ebb.frontdoor.liveness import keep_alive
from ebb.frontdoor.services import build_services
from ebb.process_memory import start_memory_reporter
from ebb.queue.connection import UNAVAILABLE_ERRORS

log = logging.getLogger(__name__)


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = build_services(settings)
        app.state.services = services
        services.drain.watch_signals()  # uvicorn's handlers are in place by now
        start_memory_reporter(settings.redis_url or "", "frontdoor")
        # Warm the tokenizers of existing deployments so first requests don't pay for it
        # (not when Redis is down: requests will wait for it, the warm-up need not).
        try:
            for spec in await services.state.list_deployments():
                services.catalog.warm(spec)
        except UNAVAILABLE_ERRORS:
            log.warning("frontdoor: Redis unreachable at start; tokenizers warm on use")
        # What start-up made (modules, routes, schemas: ~100k objects) lives as long as
        # the process: frozen, a full garbage collection no longer walks it (38 ms each,
        # which landed on whichever requests were in flight).
        gc.freeze()
        log.info("frontdoor: serving on %s", settings.base_url)
        watcher = asyncio.create_task(
            routes_batches.watch_batches(
                services,
                interval_s=settings.job_poll_s * 4,
                resume_after_s=settings.batch_resume_after_s,
            )
        )
        parked = asyncio.create_task(
            parked_jobs.watch_parked_jobs(services, interval_s=settings.job_poll_s * 4)
        )
        sweeper = asyncio.create_task(
            file_keeping.sweep_expired_files(services, interval_s=settings.job_poll_s * 4)
        )
        alive = asyncio.create_task(keep_alive(services.redis, services.instance))
        yield
        for task in (watcher, parked, sweeper, alive):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await batch_queueing.stop_queueing()
        await services.state.short_redis.aclose()
        await services.redis.aclose()

    # /openapi.json and /docs are served by routes_apidocs, behind EBB_API_DOCS.
    app = ShortcutFastAPI(
        title="ebb", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.include_router(routes_openai.router)
    app.include_router(routes_openai.inference)
    app.include_router(routes_responses.router)
    app.include_router(routes_responses.inference)
    app.include_router(routes_resume.router)
    app.include_router(routes_tokenize.router)
    app.include_router(routes_embeddings.router)
    app.include_router(routes_files.router)
    app.include_router(routes_batches.router)
    app.include_router(routes_deployments.router)
    app.include_router(routes_versions.router)
    app.include_router(routes_usage.router)
    app.include_router(routes_limits.router)
    app.include_router(routes_budgets.router)
    app.include_router(routes_quotas.router)
    app.include_router(routes_admin.router)
    app.include_router(routes_jobs.router)
    app.include_router(routes_jobs_read.router)
    app.include_router(routes_webhooks.router)
    app.include_router(routes_status.router)
    app.include_router(console_routes.router)
    app.include_router(routes_weights.router)
    app.include_router(routes_logs.router)
    app.include_router(routes_apidocs.router)
    routes_apidocs.describe_request_bodies(app)
    _install_error_handlers(app)
    redis_down.install(app, settings.redis_retry_after_s, error_response)
    app.add_middleware(
        BodyGuard,
        max_body_bytes=settings.max_body_bytes,
        # Room for the multipart framing around the file (field names, boundaries).
        max_upload_bytes=settings.batch_file_max_bytes + 64 * 1024,
    )

    app.add_middleware(RequestCounter)
    return app


class RequestCounter:
    """Counts every HTTP response by route and status for /metrics.

    Plain ASGI rather than `@app.middleware("http")`: Starlette's BaseHTTPMiddleware runs
    each request through a task group and memory streams, which cost more CPU than the
    admission of a request itself."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # an exception before any response: what ServerErrorMiddleware sends

        async def observe(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            services = getattr(scope["app"].state, "services", None)
            if services is not None:
                route = scope.get("route")
                services.metrics.count(getattr(route, "path", "unmatched"), status)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(EbbError)
    async def ebb_error(request: Request, exc: EbbError) -> JSONResponse:
        return error_response(exc)

    install_input_error_handlers(app)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("frontdoor: unhandled error on %s", request.url.path)
        return error_response(EbbError("Internal error; it has been logged."))
