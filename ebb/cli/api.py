"""The CLI's client for a running platform's HTTP API (admin key).

Exit codes scripts can trust: 0 success, 1 the platform refused (the message says why),
2 bad usage, 3 the platform could not be reached.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import typer
from rich.console import Console

from ebb.config import Settings
from ebb.home import resolve_admin_key

console = Console()
err_console = Console(stderr=True)

EXIT_REFUSED = 1
EXIT_UNREACHABLE = 3

JsonOpt = typer.Option(False, "--json", help="Print the API's JSON instead of a table.")


class Api:
    def __init__(self) -> None:
        settings = Settings()
        self.base_url = settings.base_url
        self._headers = {"Authorization": f"Bearer {resolve_admin_key(settings)}"}

    def call(self, method: str, path: str, **kwargs: Any) -> dict:
        headers = {**self._headers, **kwargs.pop("headers", {})}
        try:
            response = httpx.request(
                method, self.base_url + path, headers=headers, timeout=60, **kwargs
            )
        except httpx.HTTPError as e:
            err_console.print(
                f"[red]cannot reach ebb at {self.base_url}: {e}. "
                "Is 'ebb up' running (EBB_HOST/EBB_PORT)?"
            )
            raise typer.Exit(EXIT_UNREACHABLE) from e
        body = response.json() if response.content else {}
        if response.status_code >= 400:
            message = body.get("error", {}).get("message", response.text)
            err_console.print(f"[red]error {response.status_code}:[/] {message}")
            raise typer.Exit(EXIT_REFUSED)
        return body


def print_json(body: Any) -> None:
    typer.echo(json.dumps(body, indent=2))
