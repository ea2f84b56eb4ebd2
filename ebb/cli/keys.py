"""CLI: API keys."""

from __future__ import annotations

import time

import typer
from rich.table import Table

from ebb.cli.api import Api, JsonOpt, console, print_json

keys_app = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)


@keys_app.command("create")
def keys_create(
    tenant: str = typer.Option(..., help="The tenant the key bills to."),
    name: str = typer.Option("", help="A label to recognise the key by."),
    as_json: bool = JsonOpt,
) -> None:
    """Create an API key; the secret is shown this once."""
    body = Api().call("POST", "/v1/keys", json={"tenant": tenant, "name": name})
    if as_json:
        print_json(body)
    else:
        console.print(f"key {body['id']} for tenant {tenant}: [bold]{body['key']}[/]")
        console.print("store it now: it cannot be shown again.")


@keys_app.command("list")
def keys_list(as_json: bool = JsonOpt) -> None:
    body = Api().call("GET", "/v1/keys")
    if as_json:
        print_json(body)
        return
    table = Table("id", "tenant", "name", "created", "revoked")
    for k in body["data"]:
        table.add_row(
            k["id"],
            k["tenant"],
            k["name"],
            time.strftime("%Y-%m-%d %H:%M", time.localtime(k["created"])),
            "yes" if k["revoked"] else "",
        )
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(key_id: str) -> None:
    Api().call("DELETE", f"/v1/keys/{key_id}")
    console.print(f"revoked {key_id}")
