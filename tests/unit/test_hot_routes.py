"""The inference endpoints' route class: the endpoint gets the request directly, and the
routes stay FastAPI routes for the OpenAPI document."""

from __future__ import annotations

import pytest
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from ebb.config import Settings
from ebb.frontdoor.app import create_app
from ebb.frontdoor.hot_routes import RequestOnlyRoute


def test_the_endpoint_gets_the_request_and_answers_with_its_response():
    router = APIRouter(route_class=RequestOnlyRoute)
    seen = []

    @router.post("/echo")
    async def echo(request: Request) -> JSONResponse:
        seen.append(request)
        return JSONResponse({"query": request.url.query}, status_code=202)

    app = FastAPI()
    app.include_router(router)
    (route,) = [r for r in app.routes if getattr(r, "path", "") == "/echo"]
    assert isinstance(route, RequestOnlyRoute)  # include_router keeps the class
    assert route.get_route_handler() is echo  # no dependency solver in between
    answer = TestClient(app).post("/echo?a=1")
    assert answer.status_code == 202 and answer.json() == {"query": "a=1"}
    assert len(seen) == 1


def test_an_endpoint_with_more_than_the_request_is_refused():
    router = APIRouter(route_class=RequestOnlyRoute)
    with pytest.raises(TypeError, match="takes the request only"):

        @router.post("/two")
        async def two(request: Request, n: int) -> JSONResponse:
            return JSONResponse({})


def test_the_inference_routes_are_request_only_and_documented():
    app = create_app(Settings())
    hot = {
        r.path: r
        for r in app.routes
        if getattr(r, "path", "") in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
    }
    assert set(hot) == {"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}
    assert all(isinstance(r, RequestOnlyRoute) for r in hot.values())
    paths = app.openapi()["paths"]
    for path in ("/v1/chat/completions", "/v1/completions"):
        assert "requestBody" in paths[path]["post"]  # the bodies they parse themselves
    assert "post" in paths["/v1/embeddings"]
