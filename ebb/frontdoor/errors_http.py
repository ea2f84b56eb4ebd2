"""Errors as HTTP responses: every refusal in the OpenAI error shape, with `param` and `code`.

FastAPI's own refusals (a body that fails its model, a wrong query parameter, an unknown
route, a method a route does not have) are rephrased here so that they read like ours:
`param` names the field ("webhook.url", "limit"), never a parser position, and `code` says
what kind of refusal it was, never `internal_error`.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ebb.errors import (
    CapacityError,
    EbbError,
    InsufficientQuota,
    InvalidRequest,
    NotFound,
    RateLimited,
)

# Where FastAPI found a parameter; our messages name the parameter alone.
_LOCATIONS = {"body", "query", "path", "header", "cookie"}
_HTTP_CODES = {
    400: "invalid_request",
    401: "invalid_api_key",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    411: "length_required",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
}


def error_response(error: EbbError) -> JSONResponse:
    headers = {"X-Request-Id": error.request_id} if error.request_id else {}
    if error.version:
        headers["x-ebb-version"] = str(error.version)
    if isinstance(error, CapacityError | RateLimited):
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
    if isinstance(error, InsufficientQuota):  # OpenAI's clients would retry a 429 otherwise
        headers["x-should-retry"] = "false"
    return JSONResponse(error.to_body(), status_code=error.status_code, headers=headers)


def validation_error(exc: RequestValidationError) -> InvalidRequest:
    """The first problem FastAPI found, as a 400 naming the field and what to send."""
    errors = exc.errors()
    first: dict[str, Any] = errors[0] if errors else {}
    kind = first.get("type", "")
    loc = list(first.get("loc", ()))
    where = loc[0] if loc and loc[0] in _LOCATIONS else "body"
    if loc and loc[0] in _LOCATIONS:
        loc = loc[1:]
    if kind == "json_invalid":  # loc holds a character position, not a field
        return InvalidRequest(
            "The request body is not valid JSON; send a JSON object with "
            "'Content-Type: application/json'.",
            code="invalid_json",
        )
    param = ".".join(str(p) for p in loc) or None
    if kind == "missing" and param is None:
        return InvalidRequest(
            "The request body is missing; send a JSON object.", code="missing_body"
        )
    message = first.get("msg", "invalid request")
    if kind == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    elif kind == "missing":
        message = f"Missing required {where} parameter: '{param}'."
    elif param:
        message = f"{param}: {message}"
    elif kind in ("model_attributes_type", "dict_type"):
        message = "The request body must be a JSON object."
    return InvalidRequest(message, param=param)


def http_error(request: Request, exc: StarletteHTTPException) -> EbbError:
    """Starlette's own HTTP errors (no route, wrong method, ...) in our taxonomy."""
    if exc.status_code == 404:
        return NotFound(f"No route {request.method} {request.url.path}.")
    message = str(exc.detail)
    if exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}."
    error = EbbError(message, code=_HTTP_CODES.get(exc.status_code, "http_error"))
    error.status_code = exc.status_code
    error.error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return error


def install_input_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = error_response(http_error(request, exc))
        if exc.headers:  # e.g. Allow on a 405
            response.headers.update(exc.headers)
        return response
