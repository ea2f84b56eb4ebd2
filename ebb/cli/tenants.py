"""CLI: tenants, their quotas (what they may deploy themselves) and rate limits."""

from __future__ import annotations

import typer
from rich.table import Table

from ebb.cli.api import Api, JsonOpt, console, print_json
from ebb.cli.budgets import (
    BudgetOpt,
    BudgetPeriodOpt,
    SoftLimitOpt,
    WebhookUrlOpt,
    budget_fields,
    describe,
    webhook_fields,
)
from ebb.cli.priority_option import PriorityOpt

tenants_app = typer.Typer(
    help="Tenants: list them; show or set a tenant's quota and rate limits.",
    invoke_without_command=True,
)

_QUOTA_FIELDS = ("max_deployments", "max_replicas", "max_gpus", "max_versions", "allowed_sources")


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


@tenants_app.callback()
def tenants(ctx: typer.Context, as_json: bool = JsonOpt) -> None:
    """Tenants with their active keys, rate limits and quotas (the admin's)."""
    if ctx.invoked_subcommand is not None:
        return
    body = Api().call("GET", "/v1/tenants")
    if as_json:
        print_json(body)
        return
    table = Table(
        "tenant", "active keys", "rpm", "tpm", "deployments", "replicas", "gpus", "sources"
    )
    for t in body["data"]:
        quota = t.get("quota") or {}
        table.add_row(
            t["tenant"],
            str(t["active_keys"]),
            _limit(t["limits"]["requests_per_minute"]),
            _limit(t["limits"]["tokens_per_minute"]),
            str(quota.get("max_deployments", "-")),
            str(quota.get("max_replicas", "-")),
            str(quota.get("max_gpus", "-")),
            ", ".join(quota.get("allowed_sources", [])) or "-",
        )
    console.print(table)


def _bound(n: int) -> str:
    # A quota of 0 is none at all (a tenant without a quota deploys nothing), not unlimited.
    return "0 (none)" if n == 0 else str(n)


@tenants_app.command("quota")
def quota(
    tenant: str = typer.Argument(..., help="The tenant."),
    max_deployments: int | None = typer.Option(None, min=0, help="Deployments it may own."),
    max_replicas: int | None = typer.Option(
        None, min=0, help="max_replicas summed over its deployments."
    ),
    max_gpus: int | None = typer.Option(
        None, min=0, help="max_replicas × tensor_parallel_size summed over its deployments."
    ),
    max_versions: int | None = typer.Option(None, min=1, help="Versions kept per deployment."),
    allow_source: list[str] | None = typer.Option(
        None,
        "--allow-source",
        help="A source prefix it may deploy from, '*' any (repeat: replaces the list; '' clears).",
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Show a tenant's quota and use; with options, change them (the rest stay)."""
    api = Api()
    path = f"/v1/tenants/{tenant}/quota"
    body = api.call("GET", path)
    given = {
        "max_deployments": max_deployments,
        "max_replicas": max_replicas,
        "max_gpus": max_gpus,
        "max_versions": max_versions,
        "allowed_sources": None if allow_source is None else [p for p in allow_source if p],
    }
    if any(v is not None for v in given.values()):
        merged = {f: body[f] if given[f] is None else given[f] for f in _QUOTA_FIELDS}
        body = api.call("PUT", path, json=merged)
    if as_json:
        print_json(body)
        return
    use = body["use"]
    table = Table("", "quota", "in use", title=f"quota of {tenant}")
    table.add_row("deployments", _bound(body["max_deployments"]), str(use["deployments"]))
    table.add_row("replicas", _bound(body["max_replicas"]), str(use["replicas"]))
    table.add_row("GPUs", _bound(body["max_gpus"]), str(use["gpus"]))
    table.add_row("versions per deployment", str(body["max_versions"]), "")
    console.print(table)
    console.print("sources: " + (", ".join(body["allowed_sources"]) or "none allowed"))


@tenants_app.command("limits")
def limits(
    tenant: str = typer.Argument(..., help="The tenant (its keys share these)."),
    rpm: int | None = typer.Option(None, "--rpm", min=1, help="Requests per minute."),
    tpm: int | None = typer.Option(None, "--tpm", min=1, help="Tokens per minute."),
    priority: str | None = PriorityOpt,
    budget: str | None = BudgetOpt,
    budget_period: str = BudgetPeriodOpt,
    soft_limit: float = SoftLimitOpt,
    webhook_url: str | None = WebhookUrlOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Show a tenant's rate limits, priority and budget; with --rpm/--tpm/--priority,
    --budget or --webhook-url, set them (the others stay)."""
    api = Api()
    path = f"/v1/tenants/{tenant}/limits"
    body = api.call("GET", path)
    settings = {**budget_fields(budget, budget_period, soft_limit), **webhook_fields(webhook_url)}
    if rpm is not None or tpm is not None or priority is not None or settings:
        body = api.call(
            "PUT",
            path,
            json={
                "requests_per_minute": body["requests_per_minute"] if rpm is None else rpm,
                "tokens_per_minute": body["tokens_per_minute"] if tpm is None else tpm,
                "priority": body.get("priority") if priority is None else priority,
                **settings,
            },
        )
    if as_json:
        print_json(body)
        return
    console.print(
        f"{tenant}: {_limit(body['requests_per_minute'])} requests/min, "
        f"{_limit(body['tokens_per_minute'])} tokens/min, "
        f"priority {body.get('priority') or 'standard'}, {describe(body.get('budget'))}"
    )
