"""One way to read request bodies, for every route: bounded, strict JSON, decoded once.

`BodyGuard` is ASGI middleware in front of every route. For a request with a body it
  1. refuses it with 413 as soon as its Content-Length, or the bytes read so far, pass
     EBB_MAX_BODY_BYTES (so a 50 MB body is never held in memory);
  2. decodes it as JSON (strict UTF-8: invalid bytes and lone surrogate escapes such as
     "\\ud800" are refused), refusing anything nested deeper than MAX_JSON_DEPTH;
  3. hands the route the same bytes, and the decoded value as `decoded_json(request)`,
     so routes that parse the body themselves do not decode it twice.
Refusals are 400/413 in the OpenAI error shape. Routes therefore only ever see bodies
that are well-formed, bounded JSON, which FastAPI's own parsing can take safely too.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ebb.errors import EbbError, InvalidRequest

# Objects and arrays nested deeper than this are refused: no OpenAI body comes close (a
# json_schema 30 levels deep is about 62 here), and deeper input overflows recursive parsers
# and validators further in.
MAX_JSON_DEPTH = 128

_STATE_KEY = "ebb.json_body"
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_TOO_DEEP = f"nested more than {MAX_JSON_DEPTH} levels deep; flatten it."


class PayloadTooLarge(EbbError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


def decoded_json(request: Request) -> object:
    """The request's body as BodyGuard decoded it (None for an empty body)."""
    return request.scope.get(_STATE_KEY)


class JsonRefused(ValueError):
    """Why bytes are not strict, bounded JSON. `code`: invalid_json or json_too_deep;
    `reason` completes "... is " (it ends with a full stop)."""

    def __init__(self, code: str, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


def strict_json(raw: bytes) -> object:
    """Strict JSON (UTF-8 only, no lone surrogates, at most MAX_JSON_DEPTH deep), for
    request bodies and for every other JSON a tenant sends (a batch file's lines)."""
    try:
        value = msgspec.json.decode(raw)
    except RecursionError as e:
        raise JsonRefused("json_too_deep", _TOO_DEEP) from e
    except msgspec.DecodeError as e:
        hint = ""
        if _SURROGATE_ESCAPE.search(raw):
            hint = " Lone UTF-16 surrogate escapes (\\ud800-\\udfff) are not valid text."
        raise JsonRefused("invalid_json", f"not valid JSON ({e}).{hint}") from e
    # Nesting needs an opening bracket per level: a body with few (almost every one) is
    # passed without walking it, which costs more than decoding it.
    openers = raw.count(b"{") + raw.count(b"[")
    if openers > MAX_JSON_DEPTH and _depth_exceeds(value, MAX_JSON_DEPTH):
        raise JsonRefused("json_too_deep", _TOO_DEEP)
    return value


def decode_json(raw: bytes) -> object:
    """A request body by `strict_json`; raises InvalidRequest."""
    try:
        return strict_json(raw)
    except JsonRefused as e:
        suffix = ""
        if e.code == "invalid_json":
            suffix = " Send a UTF-8 JSON object with 'Content-Type: application/json'."
        raise InvalidRequest(f"The request body is {e.reason}{suffix}", code=e.code) from e


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Iterative (a recursive walk would fail the way the parsers do)."""
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()  # only objects and arrays are ever pushed
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


class BodyGuard:
    """ASGI middleware; see the module docstring. `max_body_bytes` is EBB_MAX_BODY_BYTES."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, max_upload_bytes: int | None = None):
        """`max_upload_bytes`: a Batch API file upload's bound (its file's limit plus room
        for the multipart framing); unset, the same as `max_body_bytes`."""
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes or max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        if _is_file_upload(scope):
            # Batch API uploads are multipart, not JSON: passed through as a stream, but
            # bounded here too, so an upload far past its limit is never spooled to disk.
            await self._upload(scope, receive, send)
            return
        try:
            raw = await self._read(scope, receive)
            scope[_STATE_KEY] = decode_json(raw) if raw.strip() else None
        except EbbError as e:
            await _send_error(send, e)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            # After the body: the route learns of a disconnect from the real channel.
            return await receive()

        await self.app(scope, replay, send)

    async def _upload(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = _content_length(scope)
        if declared is not None and declared > self.max_upload_bytes:
            await _send_error(send, self._too_large(self.max_upload_bytes))
            return
        size = 0

        async def bounded() -> Message:
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            if size > self.max_upload_bytes:
                raise self._too_large(self.max_upload_bytes)  # the route answers it
            return message

        await self.app(scope, bounded, send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes:
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            raise self._too_large()
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise InvalidRequest("The client closed the connection mid-body.")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _too_large(self, limit: int | None = None) -> PayloadTooLarge:
        if limit is not None:
            return PayloadTooLarge(
                f"The upload is larger than {limit} bytes (EBB_BATCH_FILE_MAX_BYTES plus "
                "its framing); split the batch into smaller files."
            )
        return PayloadTooLarge(
            f"The request body is larger than {self.max_body_bytes} bytes "
            "(EBB_MAX_BODY_BYTES); send a smaller one."
        )


def _is_file_upload(scope: Scope) -> bool:
    if scope.get("path") != "/v1/files":
        return False
    headers: dict[bytes, bytes] = dict(scope.get("headers") or [])
    return headers.get(b"content-type", b"").startswith(b"multipart/form-data")


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_error(send: Send, error: EbbError) -> None:
    body = msgspec.json.encode(error.to_body())
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if error.status_code == 413:
        # The rest of the body is not read: the connection cannot carry another request.
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
