"""CLI: usage."""

from __future__ import annotations

from rich.table import Table

from ebb.cli.api import Api, JsonOpt, console, print_json


def usage(as_json: bool = JsonOpt) -> None:
    """Tokens used, per deployment."""
    body = Api().call("GET", "/v1/usage")
    if as_json:
        print_json(body)
        return
    table = Table("deployment", "requests", "prompt tokens", "completion tokens")
    for row in [*body["data"], {"deployment": "total", **body["total"]}]:
        table.add_row(
            row["deployment"],
            str(row["requests"]),
            str(row["prompt_tokens"]),
            str(row["completion_tokens"]),
        )
    console.print(table)
