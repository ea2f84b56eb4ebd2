"""BodyGuard: bounded, strict JSON bodies before any route sees them."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict

from ebb.errors import EbbError, InvalidRequest
from ebb.frontdoor.body import MAX_JSON_DEPTH, BodyGuard, decode_json, decoded_json
from ebb.frontdoor.errors_http import error_response, install_input_error_handlers

LIMIT_BYTES = 64 * 1024


class Thing(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    size: int = 0


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/raw")
    async def raw(request: Request) -> dict:
        return {"decoded": decoded_json(request), "bytes": len(await request.body())}

    @app.post("/thing")
    async def thing(body: Thing) -> dict:
        return body.model_dump()

    install_input_error_handlers(app)
    app.add_middleware(BodyGuard, max_body_bytes=LIMIT_BYTES)
    return app


@pytest.fixture
async def client():
    transport = httpx.ASGITransport(app=_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c


def test_nesting_at_the_limit_decodes_and_beyond_it_is_refused():
    assert decode_json(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH) is not None
    with pytest.raises(InvalidRequest, match="nested more than") as deeper:
        decode_json(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1))
    assert deeper.value.code == "json_too_deep"
    # So deep that the parser itself gives up: the same 400, never a RecursionError.
    with pytest.raises(InvalidRequest, match="nested more than"):
        decode_json(b'{"a":' * 100_000 + b"1" + b"}" * 100_000)


@pytest.mark.parametrize(
    "raw",
    [b'{"s": "\\ud800"}', b'{"s": "\\udfff x"}', b'{"s": "\xed\xa0\x80"}', b'{"s": "\xff"}'],
)
def test_lone_surrogates_and_invalid_utf8_are_refused(raw):
    with pytest.raises(InvalidRequest, match="not valid JSON") as refused:
        decode_json(raw)
    assert refused.value.status_code == 400 and refused.value.code == "invalid_json"


def test_a_surrogate_pair_is_text():
    assert decode_json(b'{"s": "\\ud83d\\ude00"}') == {"s": "\U0001f600"}


async def test_route_gets_the_body_and_its_decoded_value(client):
    response = await client.post("/raw", json={"a": [1, 2]})
    assert response.json() == {"decoded": {"a": [1, 2]}, "bytes": len(b'{"a":[1,2]}')}


async def test_declared_oversize_body_is_refused_before_reading(client):
    body = b'{"a": "' + b"x" * LIMIT_BYTES + b'"}'
    response = await client.post("/raw", content=body)
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "request_too_large" and "EBB_MAX_BODY_BYTES" in error["message"]


async def test_chunked_oversize_body_is_refused_while_reading(client):
    chunks_seen = 0

    async def chunks():
        nonlocal chunks_seen
        for _ in range(1000):  # 16 MB if it were all read
            chunks_seen += 1
            yield b"x" * 16384

    response = await client.post("/raw", content=chunks())
    assert response.status_code == 413
    assert chunks_seen < 1000 // 4, "the body was read far past the limit"


async def test_fastapi_validation_errors_name_the_field(client):
    wrong_type = await client.post("/thing", json={"name": "a", "size": "big"})
    assert wrong_type.status_code == 400
    assert wrong_type.json()["error"]["param"] == "size"
    extra = await client.post("/thing", json={"name": "a", "colour": "red"})
    assert extra.json()["error"] == {
        "message": "Unrecognized request argument supplied: colour",
        "type": "invalid_request_error",
        "param": "colour",
        "code": "invalid_request",
    }
    missing = await client.post("/thing", json={})
    assert missing.json()["error"]["param"] == "name"
    empty = await client.post("/thing", content=b"")
    assert empty.status_code == 400
    assert empty.json()["error"]["code"] == "missing_body"


async def test_malformed_json_is_refused_without_a_parser_position(client):
    response = await client.post(
        "/thing", content=b'{"name": ', headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] is None and error["code"] == "invalid_json"


async def test_wrong_method_is_405_with_its_own_code(client):
    response = await client.get("/thing")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert response.headers["allow"] == "POST"


def _upload_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/files")
    async def upload(request: Request) -> dict:
        form = await request.form()
        return {"bytes": len(await form["file"].read())}

    install_input_error_handlers(app)

    @app.exception_handler(EbbError)
    async def ebb_error(request: Request, exc: EbbError):
        return error_response(exc)

    app.add_middleware(BodyGuard, max_body_bytes=LIMIT_BYTES, max_upload_bytes=4 * LIMIT_BYTES)
    return app


async def test_a_file_upload_is_bounded_by_its_own_limit_declared_or_streamed():
    transport = httpx.ASGITransport(app=_upload_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        small = await client.post("/v1/files", files={"file": ("a.jsonl", b"x" * 2 * LIMIT_BYTES)})
        assert small.status_code == 200 and small.json() == {"bytes": 2 * LIMIT_BYTES}

        big = await client.post("/v1/files", files={"file": ("a.jsonl", b"x" * 8 * LIMIT_BYTES)})
        assert big.status_code == 413 and "EBB_BATCH_FILE_MAX_BYTES" in big.text

        boundary = "b0undary"
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            'filename="a.jsonl"\r\n\r\n'
        ).encode()

        async def chunks():  # no Content-Length: only counting the bytes can stop it
            yield head
            for _ in range(16):
                yield b"x" * LIMIT_BYTES
            yield f"\r\n--{boundary}--\r\n".encode()

        streamed = await client.post(
            "/v1/files",
            content=chunks(),
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        assert streamed.status_code == 413
