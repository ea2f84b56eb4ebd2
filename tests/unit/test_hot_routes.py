"""The inference endpoints' way in: the endpoint gets the request directly (no dependency
solver, and for a POST no router walk), the app's exception handlers still answer what it
raises, and the routes stay FastAPI routes for the OpenAPI document."""

from __future__ import annotations

import pytest
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from starlette.routing import Match

from ebb.config import Settings
from ebb.errors import EbbError, InvalidRequest
from ebb.frontdoor.app import RequestCounter, create_app
from ebb.frontdoor.errors_http import error_response
from ebb.frontdoor.hot_routes import InferenceShortcut, RequestOnlyRoute, ShortcutFastAPI


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


def _shortcut_app() -> tuple[ShortcutFastAPI, list[dict]]:
    """An app with one request-only POST route, one plain route, and ebb's error handler."""
    hot = APIRouter(route_class=RequestOnlyRoute)
    plain = APIRouter()
    scopes: list[dict] = []

    @hot.post("/v1/hot")
    async def hot_endpoint(request: Request) -> JSONResponse:
        scopes.append(request.scope)
        if request.headers.get("x-fail"):
            raise InvalidRequest("bad", code="bad_input")
        return JSONResponse({"ok": True})

    @plain.get("/plain/{n}")
    async def plain_endpoint(n: int) -> dict:
        return {"n": n}

    app = ShortcutFastAPI()
    app.include_router(hot)
    app.include_router(plain)
    app.add_exception_handler(EbbError, lambda request, exc: error_response(exc))
    return app, scopes


def test_a_post_to_a_request_only_path_reaches_its_endpoint_without_the_router(monkeypatch):
    app, scopes = _shortcut_app()
    # The router would ask each route whether it matches: here, none may be asked.
    monkeypatch.setattr(
        RequestOnlyRoute, "matches", lambda self, scope: pytest.fail("the router was walked")
    )
    answer = TestClient(app).post("/v1/hot")
    assert answer.status_code == 200 and answer.json() == {"ok": True}
    (scope,) = scopes
    route = scope["route"]  # what the router would have set, for RequestCounter and others
    assert isinstance(route, RequestOnlyRoute) and route.path == "/v1/hot"
    assert scope["endpoint"] is route.endpoint and scope["path_params"] == {}
    assert scope["router"] is app.router


def test_what_the_endpoint_raises_meets_the_apps_exception_handlers():
    app, _ = _shortcut_app()
    answer = TestClient(app).post("/v1/hot", headers={"x-fail": "1"})
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "bad_input"


def test_other_methods_and_paths_go_through_the_router():
    app, scopes = _shortcut_app()
    client = TestClient(app)
    assert client.get("/plain/7").json() == {"n": 7}
    assert client.get("/v1/hot").status_code == 405  # the router's answer, not the endpoint's
    # Not the exact path: the router redirects, as it always has.
    assert client.post("/v1/hot/", follow_redirects=False).status_code == 307
    assert scopes == []


def test_the_frontdoor_puts_the_shortcut_just_inside_its_exception_handling():
    app = create_app(Settings())
    layers = []
    layer = app.build_middleware_stack()
    while layer is not app.router:  # the router stays the innermost app
        layers.append(type(layer).__name__)
        layer = layer.app
    at = layers.index("ExceptionMiddleware")
    assert layers[at + 1] == InferenceShortcut.__name__
    assert layers.index(RequestCounter.__name__) < at  # counted, like every response


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
def test_the_shortcut_takes_the_route_the_router_would_have_taken(path):
    """No route earlier in the frontdoor's list (one with a path parameter, say) matches a
    shortcut path first: skipping the walk changes nothing about which endpoint answers."""
    app = create_app(Settings())
    scope = {"type": "http", "method": "POST", "path": path, "root_path": ""}
    first = next(r for r in app.router.routes if r.matches(scope)[0] is Match.FULL)
    shortcut = InferenceShortcut(app.router, app.router)
    assert shortcut._routes[path] is first
