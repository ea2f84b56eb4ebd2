"""CLI views of the weight cache: `ebb deploy`'s progress bar and `ebb status`'s cache."""

from __future__ import annotations

import time

import typer
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from ebb.cli.api import EXIT_REFUSED, Api, JsonObject, console, err_console

_POLL_S = 0.25
# What each preparation phase is called on the bar.
_PHASES = {
    "starting": "starting",
    "download": "downloading",
    "convert": "converting",
    "hash": "hashing",
    "verify": "verifying",
    "publish": "publishing",
    "tokenizer": "loading the tokenizer",
}


def wait_for_weights(api: Api, name: str, timeout_s: float = 1800) -> JsonObject:
    """Poll the deployment until its weights are in the cache, with a progress bar of the
    phase the platform reports; exit with EXIT_REFUSED if preparing them failed."""
    deadline = time.monotonic() + timeout_s
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task(f"{name}: preparing weights", total=1.0)
        while True:
            body = api.call("GET", f"/v1/deployments/{name}")
            if body["weights"] == "failed":
                err_console.print(f"[red]weights of {name} failed:[/] {body['error']}")
                raise typer.Exit(EXIT_REFUSED)
            if body["weights"] in ("ready", "unknown") or time.monotonic() > deadline:
                return body
            progress = body.get("weights_progress") or {}
            phase = _PHASES.get(progress.get("phase", ""), progress.get("phase", "preparing"))
            bar.update(task, description=f"{name}: {phase}", completed=progress.get("fraction", 0))
            time.sleep(_POLL_S)


def print_cache(report: JsonObject) -> None:
    """The cache's models, most recently used first, and its evictions."""
    budget = report["budget_bytes"]
    limit = f" of {_size(budget)}" if budget else " (no budget)"
    console.print(f"weight cache {report['cache_dir']}: {_size(report['used_bytes'])}{limit}")
    table = Table("model", "source", "size", "last used", "state")
    for entry in report["entries"]:
        state = "partial" if entry["partial"] else "in use" if entry["in_use"] else "idle"
        age_s = max(0.0, time.time() - entry["last_access_s"])
        table.add_row(
            entry["key"], entry["source"], _size(entry["size_bytes"]), f"{age_s:.0f}s ago", state
        )
    console.print(table)
    if report["evictions_total"]:
        console.print(
            f"evictions: {report['evictions_total']} ({_size(report['evicted_bytes_total'])})"
        )
        for eviction in report["recent_evictions"][-5:]:
            console.print(f"  {eviction['at']} {eviction['key']} ({_size(eviction['size_bytes'])})")


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
