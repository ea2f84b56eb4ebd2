"""The CLI's client for a running platform's HTTP API.

It calls with EBB_API_KEY (a tenant key) when set, else the admin key (EBB_ADMIN_KEY or
EBB_HOME/admin_key). Exit codes scripts can trust: 0 success, 1 the platform refused (the
message says why), 2 bad usage or no key to call with, 3 the platform could not be reached.
Errors always go to stderr, so stdout (with --json) stays parseable.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import httpx
import typer
from rich.console import Console

from ebb.config import Settings
from ebb.home import ADMIN_KEY_FILE

# Piped or redirected output has no terminal width; Rich would then cut tables at 80
# columns, so a wide one is used there (COLUMNS, when set, still wins).
PIPED_WIDTH = 1000


def _width(stream: object) -> int | None:
    isatty = getattr(stream, "isatty", None)
    if os.environ.get("COLUMNS") or (isatty is not None and isatty()):
        return None
    return PIPED_WIDTH


console = Console(width=_width(sys.stdout))
err_console = Console(stderr=True, width=_width(sys.stderr))

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

# A JSON object as the API answers: the CLI reads the fields it shows, by name.
JsonObject = dict[str, Any]

JsonOpt = typer.Option(False, "--json", help="Print the API's JSON instead of a table.")


def _cli_key(settings: Settings) -> str:
    # Read-only on purpose: the CLI must never mint an admin key the platform doesn't know.
    if settings.api_key:
        return settings.api_key
    if settings.admin_key:
        return settings.admin_key
    path = settings.home / ADMIN_KEY_FILE
    if path.exists():
        return path.read_text().strip()
    err_console.print(
        f"[red]no API key:[/] set EBB_API_KEY to a tenant key, or EBB_ADMIN_KEY, or run where "
        f"EBB_HOME points at the platform's home (no {path} here)."
    )
    raise typer.Exit(EXIT_USAGE)


class Api:
    def __init__(self) -> None:
        settings = Settings()
        self.base_url = settings.base_url
        self._headers = {"Authorization": f"Bearer {_cli_key(settings)}"}

    def call(self, method: str, path: str, **kwargs: Any) -> JsonObject:
        headers = {**self._headers, **kwargs.pop("headers", {})}
        try:
            response = httpx.request(
                method, self.base_url + path, headers=headers, timeout=60, **kwargs
            )
        except httpx.HTTPError as e:
            self._unreachable(e)
        if response.status_code >= 400:
            self._refused(response)
        return _json_of(response)

    def get_bytes(self, path: str) -> bytes:
        """GET a non-JSON body (a file's content); refusals exit like `call`."""
        try:
            response = httpx.get(self.base_url + path, headers=self._headers, timeout=60)
        except httpx.HTTPError as e:
            self._unreachable(e)
        if response.status_code >= 400:
            self._refused(response)
        return response.content

    def get_if_allowed(self, path: str) -> JsonObject | None:
        """GET `path`, or None when this key may not (admin-only views in mixed output)."""
        try:
            response = httpx.get(self.base_url + path, headers=self._headers, timeout=60)
        except httpx.HTTPError as e:
            self._unreachable(e)
        if response.status_code in (401, 403):
            return None
        if response.status_code >= 400:
            self._refused(response)
        return _json_of(response)

    @contextmanager
    def stream(self, method: str, path: str, **kwargs: Any) -> Iterator[httpx.Response]:
        """An open streaming response; refusals and network errors exit like `call`."""
        try:
            with httpx.stream(
                method, self.base_url + path, headers=self._headers, timeout=300, **kwargs
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    self._refused(response)
                yield response
        except httpx.HTTPError as e:
            self._unreachable(e)

    def _unreachable(self, e: httpx.HTTPError) -> NoReturn:
        err_console.print(
            f"[red]cannot reach ebb at {self.base_url}: {e}. "
            "Is 'ebb up' running (EBB_HOST/EBB_PORT)?"
        )
        raise typer.Exit(EXIT_UNREACHABLE) from e

    def _refused(self, response: httpx.Response) -> NoReturn:
        body = _json_of(response)
        error = body.get("error")
        told = error.get("message") if isinstance(error, dict) else None
        message = told or response.text.strip() or response.reason_phrase
        retry = response.headers.get("retry-after")
        hint = f" (retry after {retry} s)" if retry else ""
        err_console.print(f"[red]error {response.status_code}:[/] {message}{hint}")
        raise typer.Exit(EXIT_REFUSED)


def _json_of(response: httpx.Response) -> JsonObject:
    try:
        body = response.json() if response.content else {}
    except ValueError:  # a proxy's HTML error page, say
        return {}
    return body if isinstance(body, dict) else {"data": body}


def print_json(body: Any) -> None:
    typer.echo(json.dumps(body, indent=2))
