"""CLI: usage and cost from the ledger, reconcile, and deployment prices."""

from __future__ import annotations

import typer
from rich.table import Table

from ebb.billing.pricing import format_micros
from ebb.cli.api import Api, JsonObject, JsonOpt, console, err_console, print_json
from ebb.cli.budgets import print_budgets, usage_budget
from ebb.cli.deployment_options import BatchDiscountOpt, price_fields
from ebb.cli.usage_costs import gpu_costs_table

# `ebb usage reconcile` found the aggregates disagreeing with the raw records.
EXIT_DRIFT = 4

usage_app = typer.Typer(
    help="Tokens, GPU-seconds and cost per deployment, day or tenant.",
    invoke_without_command=True,
)


@usage_app.callback()
def usage(
    ctx: typer.Context,
    start: str | None = typer.Option(None, help="From (unix seconds or ISO date/time, UTC)."),
    end: str | None = typer.Option(None, help="Until (exclusive); default now."),
    group_by: str = typer.Option(
        "deployment", "--group-by", help="Comma-separated: tenant, deployment, day, hour."
    ),
    tenant: str | None = typer.Option(None, help="Only this tenant."),
    costs: bool = typer.Option(
        False, "--costs", help="Where the GPU-seconds went, and cost per 1M output tokens."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Usage and cost, whole hours, from the ledger."""
    if ctx.invoked_subcommand is not None:
        return
    params = {"start": start, "end": end, "group_by": group_by, "tenant": tenant}
    body = Api().call("GET", "/v1/usage", params={k: v for k, v in params.items() if v is not None})
    if as_json:
        print_json(body)
        return
    groups = body["group_by"]
    table = Table(*groups, "requests", "prompt tokens", "completion tokens", "GPU s", "cost")
    for row in [*body["data"], {groups[0]: "total", **body["total"]}]:
        table.add_row(
            *(str(row.get(g, "")) for g in groups),
            str(row["requests"]),
            str(row["prompt_tokens"]),
            str(row["completion_tokens"]),
            f"{row['gpu_seconds']:.1f}",
            format_micros(row["cost_micros"]),
        )
    # Without --start the API counts from the epoch; say so rather than print 1970.
    console.print(f"usage {body['start'] + ' ..' if start else 'all time until'} {body['end']}")
    console.print(table)
    if body["unit_economics"]:
        console.print(_unit_economics_table(body["unit_economics"]))
    if costs:
        console.print(gpu_costs_table(body.get("gpu_costs", [])))
    print_budgets(tenant)


def _unit_economics_table(rows: list[JsonObject]) -> Table:
    table = Table(
        "deployment", "GPU s", "output tokens", "GPU s / 1M output", "GPU cost / 1M output"
    )
    for row in rows:
        per_1m = row["gpu_seconds_per_1m_output_tokens"]
        cost = row["gpu_cost_micros_per_1m_output_tokens"]
        table.add_row(
            row["deployment"],
            f"{row['gpu_seconds']:.1f}",
            str(row["completion_tokens"]),
            "-" if per_1m is None else f"{per_1m:.1f}",
            "-" if cost is None else format_micros(cost),
        )
    return table


usage_app.command("budget")(usage_budget)


@usage_app.command("reconcile")
def usage_reconcile(as_json: bool = JsonOpt) -> None:
    """Recompute the aggregates from the raw records; exit 4 on any drift."""
    body = Api().call("GET", "/v1/usage/reconcile")
    if as_json:
        print_json(body)
    else:
        console.print(
            f"{body['records']} raw records, {body['entries']} entries, {body['hours']} hours, "
            f"{body['exported_hours_checked']} exported files checked, "
            f"{body['pending_exports']} hours waiting for export"
        )
        for dup in body["duplicate_request_ids"]:
            console.print(f"[yellow]request {dup} appears twice in the raw records; billed once")
        for drift in body["drift"]:
            err_console.print(
                f"[red]drift[/] {drift['where']} {drift['hour']} {drift['field']}: "
                f"stored {drift['stored']}, raw records say {drift['recomputed']}"
            )
        for entry in body["undecodable"]:
            err_console.print(f"[red]undecodable raw record[/] {entry}")
        console.print("[green]no drift" if body["ok"] else "[red]the ledger has drifted")
    if not body["ok"]:
        raise typer.Exit(EXIT_DRIFT)


def price(
    name: str = typer.Argument(..., help="The deployment."),
    input_price: str | None = typer.Option(None, "--input", help="Per 1M input tokens, e.g. 0.15"),
    output_price: str | None = typer.Option(
        None, "--output", help="Per 1M output tokens, e.g. 0.60"
    ),
    gpu_second: str | None = typer.Option(None, "--gpu-second", help="Per GPU-second."),
    owner: str | None = typer.Option(None, help="The tenant billed for its GPU time."),
    batch_discount: int | None = BatchDiscountOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Set a deployment's prices (decimal amounts, exact to a micro-unit), Batch API
    discount or owner (the admin's)."""
    patch: dict[str, object] = {"owner": owner} if owner else {}
    patch.update(
        price_fields(input_price, output_price, gpu_second, ("--input", "--output", "--gpu-second"))
    )
    if batch_discount is not None:
        patch["serving"] = {"batch_discount_pct": batch_discount}
    if not patch:
        raise typer.BadParameter(
            "give at least one of --input, --output, --gpu-second, --owner, --batch-discount"
        )
    body = Api().call("PATCH", f"/v1/deployments/{name}", json=patch)
    if as_json:
        print_json(body)
        return
    console.print(
        f"{name}: {format_micros(body['price_per_1m_input_tokens_micros'])} per 1M input tokens, "
        f"{format_micros(body['price_per_1m_output_tokens_micros'])} per 1M output tokens, "
        f"{format_micros(body['price_per_gpu_second_micros'])} per GPU-second, batch "
        f"{body['serving']['batch_discount_pct']} % off; GPU time billed to {body['owner']}"
    )
