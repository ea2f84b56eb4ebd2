"""CLI: spend caps. The options `ebb keys limits` and `ebb tenants limits` take to set a
budget, and `ebb usage budget`, which shows budgets and what they spent this period."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from ebb.billing.pricing import format_micros, parse_money
from ebb.cli.api import Api, JsonObject, JsonOpt, console, print_json

BudgetOpt = typer.Option(
    None,
    "--budget",
    help="Spend cap, a decimal amount in the prices' currency (e.g. 50.00); 'none' removes it.",
)
BudgetPeriodOpt = typer.Option(
    "lifetime", "--budget-period", help="day, month (UTC) or lifetime: when the budget resets."
)
SoftLimitOpt = typer.Option(
    0.8, "--soft-limit", help="Fraction of the budget whose crossing sends the webhook."
)
WebhookUrlOpt = typer.Option(
    None,
    "--webhook-url",
    help="Where the tenant's budget.soft_limit_reached events go; 'none' removes it.",
)


def budget_fields(amount: str | None, period: str, soft_limit: float) -> dict[str, Any]:
    """The limits body's `budget` for these options ({} when --budget was not given)."""
    if amount is None:
        return {}
    if amount.strip().lower() == "none":
        return {"budget": None}
    if period not in ("day", "month", "lifetime"):
        raise typer.BadParameter("--budget-period: give day, month or lifetime")
    try:
        micros = parse_money(amount, "--budget")
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    return {
        "budget": {
            "amount_micros": micros,
            "period": None if period == "lifetime" else period,
            "soft_limit": soft_limit,
        }
    }


def webhook_fields(url: str | None) -> dict[str, Any]:
    if url is None:
        return {}
    return {"webhook_url": None if url.strip().lower() == "none" else url}


def describe(budget: JsonObject | None) -> str:
    """'12.000000 of 50.000000 per day (resets 2026-12-07T00:00:00Z)', or 'no budget'."""
    if not budget:
        return "no budget"
    per = f"per {budget['period']}" if budget["period"] else "lifetime"
    reset = f", resets {budget['resets_at']}" if budget["resets_at"] else ""
    held = budget["reserved_micros"]
    reserved = f", {format_micros(held)} reserved" if held else ""
    return (
        f"{format_micros(budget['spent_micros'])} of {format_micros(budget['amount_micros'])} "
        f"spent {per}{reserved}{reset}"
    )


def usage_budget(
    tenant: str | None = typer.Option(None, help="Only this tenant (the admin's)."),
    key: str | None = typer.Option(None, "--key", help="Also this key's id (the admin's)."),
    as_json: bool = JsonOpt,
) -> None:
    """Budgets and their spend this period: the caller's, or (admin) every one or a tenant's."""
    body = _budgets(tenant, key)
    if as_json:
        print_json(body)
        return
    console.print(budgets_table(body["data"]))


def print_budgets(tenant: str | None) -> None:
    """Under `ebb usage`: the budgets in force and their spend, if any is set."""
    rows = [r for r in _budgets(tenant, None)["data"] if r["budget"]]
    if rows:
        console.print(budgets_table(rows))


def _budgets(tenant: str | None, key: str | None) -> JsonObject:
    params = {"tenant": tenant, "key_id": key}
    return Api().call(
        "GET", "/v1/budgets", params={k: v for k, v in params.items() if v is not None}
    )


def budgets_table(rows: list[JsonObject]) -> Table:
    table = Table("tenant", "key", "budget", "spent", "reserved", "soft limit", "resets at")
    for row in rows:
        b = row["budget"]
        if b is None:
            table.add_row(row["tenant"] or "", row["key_id"] or "", "none", "", "", "", "")
            continue
        table.add_row(
            row["tenant"] or "",
            row["key_id"] or "",
            f"{format_micros(b['amount_micros'])} / {b['period'] or 'lifetime'}",
            format_micros(b["spent_micros"]),
            format_micros(b["reserved_micros"]),
            f"{b['soft_limit']:.0%}",
            b["resets_at"] or "never",
        )
    return table
