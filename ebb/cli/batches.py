"""CLI: the Batch API (list, create from a JSONL file, show, cancel, output)."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from ebb.cli.api import EXIT_REFUSED, Api, JsonObject, JsonOpt, console, err_console, print_json

batches_app = typer.Typer(
    help="Batches: list them, or create, show, cancel one and print its output.",
    invoke_without_command=True,
)

_SETTLED = ("completed", "failed", "expired", "cancelled")


def _table(rows: list[JsonObject]) -> Table:
    table = Table("id", "endpoint", "status", "created", "done", "failed", "total", "output")
    for batch in rows:
        counts = batch["request_counts"]
        table.add_row(
            batch["id"],
            batch["endpoint"],
            batch["status"],
            time.strftime("%H:%M:%S", time.localtime(batch["created_at"])),
            str(counts["completed"]),
            str(counts["failed"]),
            str(counts["total"]),
            batch["output_file_id"] or "",
        )
    return table


def _print(body: JsonObject, as_json: bool) -> None:
    if as_json:
        print_json(body)
    else:
        console.print(_table(body.get("data", [body])))


@batches_app.callback()
def batches(
    ctx: typer.Context,
    limit: int = typer.Option(20, help="How many, newest first."),
    as_json: bool = JsonOpt,
) -> None:
    """List your batches, newest first."""
    if ctx.invoked_subcommand is None:
        _print(Api().call("GET", "/v1/batches", params={"limit": limit}), as_json)


@batches_app.command("create")
def create(
    path: Path = typer.Argument(..., exists=True, dir_okay=False, help="The JSONL input."),
    endpoint: str = typer.Option("/v1/chat/completions", help="The endpoint of every line."),
    wait: bool = typer.Option(False, "--wait", help="Wait until it is settled."),
    as_json: bool = JsonOpt,
) -> None:
    """Upload a JSONL file of requests and run it as a batch."""
    api = Api()
    with path.open("rb") as f:
        uploaded = api.call(
            "POST", "/v1/files", files={"file": (path.name, f)}, data={"purpose": "batch"}
        )
    batch = api.call(
        "POST",
        "/v1/batches",
        json={"input_file_id": uploaded["id"], "endpoint": endpoint, "completion_window": "24h"},
    )
    if wait:
        with err_console.status(f"waiting for {batch['id']}"):
            while batch["status"] not in _SETTLED:
                time.sleep(1)
                batch = api.call("GET", f"/v1/batches/{batch['id']}")
    _print(batch, as_json)
    if batch["status"] in ("failed", "expired"):
        raise typer.Exit(EXIT_REFUSED)


@batches_app.command("show")
def show(batch_id: str, as_json: bool = JsonOpt) -> None:
    """A batch with its request counts and files."""
    _print(Api().call("GET", f"/v1/batches/{batch_id}"), as_json)


@batches_app.command("cancel")
def cancel(batch_id: str, as_json: bool = JsonOpt) -> None:
    """Cancel a batch: queued lines never run, running ones are aborted."""
    _print(Api().call("POST", f"/v1/batches/{batch_id}/cancel"), as_json)


@batches_app.command("output")
def output(
    batch_id: str,
    errors: bool = typer.Option(False, "--errors", help="The error file instead."),
) -> None:
    """Print a settled batch's output (or error) file, one JSON result per line."""
    api = Api()
    batch = api.call("GET", f"/v1/batches/{batch_id}")
    file_id = batch["error_file_id" if errors else "output_file_id"]
    if not file_id:
        err_console.print(f"batch {batch_id} has no {'error' if errors else 'output'} file yet")
        raise typer.Exit(EXIT_REFUSED)
    typer.echo(api.get_bytes(f"/v1/files/{file_id}/content").decode(), nl=False)
