"""CLI: API keys, tenants and their rate limits."""

from __future__ import annotations

import time

import typer
from rich.table import Table

from ebb.cli.api import Api, JsonOpt, console, print_json
from ebb.cli.budgets import BudgetOpt, BudgetPeriodOpt, SoftLimitOpt, budget_fields, describe
from ebb.cli.priority_option import PriorityOpt

keys_app = typer.Typer(
    help="Create, list and revoke API keys; set rate limits.", no_args_is_help=True
)

RpmOpt = typer.Option(None, "--rpm", min=1, help="Requests per minute (default: unlimited).")
TpmOpt = typer.Option(None, "--tpm", min=1, help="Tokens per minute (default: unlimited).")


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


@keys_app.command("create")
def keys_create(
    tenant: str = typer.Option(..., help="The tenant the key bills to."),
    name: str = typer.Option("", help="A label to recognise the key by."),
    rpm: int | None = RpmOpt,
    tpm: int | None = TpmOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Create an API key; the secret is shown this once (only its hash is stored)."""
    body = Api().call(
        "POST",
        "/v1/keys",
        json={
            "tenant": tenant,
            "name": name,
            "requests_per_minute": rpm,
            "tokens_per_minute": tpm,
        },
    )
    if as_json:
        print_json(body)
    else:
        console.print(f"key {body['id']} for tenant {tenant}: [bold]{body['key']}[/]")
        console.print("store it now: it cannot be shown again.")


@keys_app.command("list")
def keys_list(
    prefix: str | None = typer.Option(None, help="Keys whose id or secret starts with this."),
    tenant: str | None = typer.Option(None, help="Only this tenant's keys."),
    as_json: bool = JsonOpt,
) -> None:
    """List keys (never their secrets: those are not stored)."""
    params = {k: v for k, v in {"prefix": prefix, "tenant": tenant}.items() if v}
    body = Api().call("GET", "/v1/keys", params=params)
    if as_json:
        print_json(body)
        return
    table = Table("id", "prefix", "tenant", "name", "created", "rpm", "tpm", "revoked")
    for k in body["data"]:
        table.add_row(
            k["id"],
            k["prefix"] + "…",
            k["tenant"],
            k["name"],
            time.strftime("%Y-%m-%d %H:%M", time.localtime(k["created"])),
            _limit(k["limits"]["requests_per_minute"]),
            _limit(k["limits"]["tokens_per_minute"]),
            "yes" if k["revoked"] else "",
        )
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(key_id: str) -> None:
    """Revoke a key: it stops working at once."""
    Api().call("DELETE", f"/v1/keys/{key_id}")
    console.print(f"revoked {key_id}")


@keys_app.command("limits")
def keys_limits(
    key: str | None = typer.Option(None, "--key", help="A key's id."),
    tenant: str | None = typer.Option(None, help="A tenant (shared by all its keys)."),
    rpm: int | None = RpmOpt,
    tpm: int | None = TpmOpt,
    priority: str | None = PriorityOpt,
    budget: str | None = BudgetOpt,
    budget_period: str = BudgetPeriodOpt,
    soft_limit: float = SoftLimitOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Set (or, with none of --rpm, --tpm and --priority, remove) the limits of a key or
    a tenant. With --budget alone, only the budget changes."""
    if (key is None) == (tenant is None):
        raise typer.BadParameter("give exactly one of --key and --tenant")
    path = f"/v1/keys/{key}/limits" if key else f"/v1/tenants/{tenant}/limits"
    api = Api()
    spend_cap = budget_fields(budget, budget_period, soft_limit)
    limits = {"requests_per_minute": rpm, "tokens_per_minute": tpm, "priority": priority}
    if spend_cap and rpm is None and tpm is None and priority is None:
        current = api.call("GET", path)
        limits = {k: current.get(k) for k in limits}
    body = api.call("PUT", path, json={**limits, **spend_cap})
    if as_json:
        print_json(body)
        return
    console.print(
        f"{key or tenant}: {_limit(body['requests_per_minute'])} requests/min, "
        f"{_limit(body['tokens_per_minute'])} tokens/min, "
        f"priority {body.get('priority') or 'inherited'}, {describe(body.get('budget'))}"
    )


@keys_app.command("tenants")
def keys_tenants(as_json: bool = JsonOpt) -> None:
    """Tenants with their active keys and limits."""
    body = Api().call("GET", "/v1/tenants")
    if as_json:
        print_json(body)
        return
    table = Table("tenant", "active keys", "rpm", "tpm")
    for t in body["data"]:
        limits = t["limits"]
        table.add_row(
            t["tenant"],
            str(t["active_keys"]),
            _limit(limits["requests_per_minute"]),
            _limit(limits["tokens_per_minute"]),
        )
    console.print(table)
