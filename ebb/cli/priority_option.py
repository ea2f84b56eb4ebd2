"""The CLI's --priority option (classes: ebb.queue.priority; the API validates them)."""

from __future__ import annotations

import typer

PriorityOpt = typer.Option(
    None,
    "--priority",
    help="Priority class: critical, standard or sheddable (under saturation sheddable "
    "requests are refused first and critical ones claimed first).",
)
