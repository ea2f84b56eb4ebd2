"""CLI: one deployment in detail, and deleting it (the console's deployment view)."""

from __future__ import annotations

import sys
import time

import typer
from rich.table import Table

from ebb.billing.pricing import format_money
from ebb.cli.api import Api, JsonObject, JsonOpt, console, print_json

REPLICA_STATES = ("prewarmed", "loading", "ready", "draining")


def _clock(epoch_ms: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch_ms / 1000)) if epoch_ms else "—"


def _replicas_table(d: JsonObject) -> Table:
    replicas = dict(d["replicas"])
    # A fresh process importing libraries is part of loading, as in the console.
    replicas["loading"] = replicas.get("loading", 0) + replicas.get("starting", 0)
    table = Table("pre-warmed", "loading", "ready", "draining", "queue", title="replicas")
    table.add_row(*(str(replicas.get(s, 0)) for s in REPLICA_STATES), str(d["queue_depth"]))
    return table


def _cold_start_table(d: JsonObject) -> Table:
    table = Table("tier", "total", "phases", title="cold starts")
    for tier, phases in d["cold_start_ms"].items():
        detail = " · ".join(f"{k} {v:.0f} ms" for k, v in phases.items() if k != "total")
        table.add_row(tier, f"{phases.get('total', 0):.0f} ms", detail)
    return table


def _runners_table(runners: list[JsonObject]) -> Table:
    table = Table("runner", "state", "tier", "pid", "launched", "ready", "error", title="runners")
    for r in runners:
        table.add_row(
            r["id"],
            r["state"],
            r["tier"] or "—",
            str(r["pid"] or "—"),
            _clock(r["launched_ms"]),
            _clock(r["ready_ms"]),
            r["error"] or "",
        )
    return table


# The spec's fields in the order shown; anything else the API adds (a field newer than
# this list) is shown after them, so the whole configuration is always on screen.
_CONFIG_ORDER = (
    "source",
    "owner",
    "visibility",
    "shared_with",
    "priority",
    "min_replicas",
    "max_replicas",
    "idle_timeout_s",
    "max_concurrency",
    "queue_depth_limit",
    "admission_timeout_s",
    "max_model_len",
    "price_per_1m_input_tokens_micros",
    "price_per_1m_output_tokens_micros",
    "price_per_gpu_second_micros",
    "engine",
    "serving",
    "created_at_s",
)
# The view's runtime state, shown in tables of its own.
_RUNTIME = {
    "object",
    "name",
    "status",
    "replicas",
    "queue_depth",
    "job_queue_depth",
    "oldest_wait_s",
    "weights_progress",
    "error",
    "error_log",
    "cold_start_ms",
    "runners",
}


def _config_value(key: str, value: object) -> str:
    if value is None:
        return "default"
    if key == "created_at_s" and isinstance(value, int | float):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
    if key.startswith("price_") and isinstance(value, int):
        return format_money(value)
    if isinstance(value, dict):
        parts = []
        for k, v in value.items():
            if k == "chat_template" and v:
                v = f"<{len(v)} characters>"
            parts.append(f"{k} {'default' if v is None or v == '' else v}")
        return " · ".join(parts)
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "—"
    return str(value)


def _config_table(d: JsonObject) -> Table:
    """Every configuration field of the view (a tenant's view has fewer)."""
    table = Table("setting", "value", title="configuration")
    keys = [k for k in _CONFIG_ORDER if k in d]
    keys += [k for k in d if k not in _RUNTIME and k not in keys]
    for key in keys:
        table.add_row(key, _config_value(key, d[key]))
    return table


def show_deployment(name: str, as_json: bool = JsonOpt) -> None:
    """One deployment: replicas, cold starts, runners with their last log lines, errors."""
    d = Api().call("GET", f"/v1/deployments/{name}")
    if as_json:
        print_json(d)
        return
    console.print(f"[bold]{d['name']}[/]  {d['status']}")
    console.print(_config_table(d))
    console.print(_replicas_table(d))
    if d["cold_start_ms"]:
        console.print(_cold_start_table(d))
    runners = sorted(d["runners"], key=lambda r: r["launched_ms"], reverse=True)
    if runners:
        console.print(_runners_table(runners))
    for r in runners:
        if r.get("log_tail"):
            console.print(f"last log lines of {r['id']} ({r['state']}):", style="bold")
            console.print("\n".join(f"  {line}" for line in r["log_tail"]), markup=False)
    if d["error"]:
        console.print(f"[red]error:[/] {d['error']}")
        if d["error_log"]:
            console.print(d["error_log"], markup=False)


def delete_deployment(
    name: str,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    as_json: bool = JsonOpt,
) -> None:
    """Delete a deployment; its runners finish what they hold, then exit."""
    # Ask only a person at a terminal; scripts (no TTY) are not left waiting on a prompt.
    if not yes and sys.stdin.isatty():
        typer.confirm(f"Delete {name}? Requests for model {name!r} will get 404", abort=True)
    body = Api().call("DELETE", f"/v1/deployments/{name}")
    if as_json:
        print_json(body)
    else:
        console.print(f"deleted {name}")
