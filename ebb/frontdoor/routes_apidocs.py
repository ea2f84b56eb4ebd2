"""The API's description: /openapi.json and the /docs page, behind EBB_API_DOCS.

With EBB_API_DOCS off (the default) the schema is served to the admin key only and there
is no /docs page: an anonymous caller learns nothing about the routes. With it on, both
are public. Either way the schema describes every request body, the chat and completions
ones included (those routes parse their bodies themselves, so FastAPI cannot see them).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ebb.errors import NotFound
from ebb.frontdoor.auth import authenticate, require_admin
from ebb.frontdoor.routes_tokenize import DetokenizeRequest, TokenizeRequest
from ebb.frontdoor.services import ServicesDep
from ebb.openai.responses_schema import ResponsesRequest
from ebb.openai.schema import ChatCompletionRequest, CompletionRequest

router = APIRouter(include_in_schema=False)

_OWN_BODIES: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/responses": ResponsesRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
}


@router.get("/openapi.json")
async def openapi_schema(request: Request, services: ServicesDep) -> JSONResponse:
    if not services.settings.api_docs:
        await require_admin(await authenticate(request, services))
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def docs_page(services: ServicesDep) -> HTMLResponse:
    if not services.settings.api_docs:
        raise NotFound("No route GET /docs (the API docs are off; set EBB_API_DOCS=1).")
    return get_swagger_ui_html(openapi_url="/openapi.json", title="ebb API")


def describe_request_bodies(app: FastAPI) -> None:
    """Make `app.openapi()` include the bodies of the routes that parse their own."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            _add_own_bodies(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _add_own_bodies(schema: dict[str, Any]) -> None:
    refs, defs = models_json_schema(
        [(model, "validation") for model in _OWN_BODIES.values()],
        ref_template="#/components/schemas/{model}",
    )
    schema.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
    for path, model in _OWN_BODIES.items():
        operation = schema["paths"].get(path, {}).get("post")
        if operation is None:
            continue
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": refs[(model, "validation")]}},
        }
