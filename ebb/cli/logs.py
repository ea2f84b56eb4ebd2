"""CLI: `ebb logs [DEPLOYMENT] [-f] [--runner ID] [--since]` over the platform's API."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

import typer

from ebb.cli.api import EXIT_USAGE, Api, err_console

# How often `ebb logs -f` asks for new lines.
_FOLLOW_POLL_S = 0.5
_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now_s: float) -> float:
    """'90s', '10m', '2h', '1d' ago, or an ISO date/time (UTC unless it says otherwise)."""
    match = _AGO.match(text.strip())
    if match:
        return now_s - float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        err_console.print(f"[red]--since {text!r}:[/] use 10m, 2h, 1d or an ISO date/time")
        raise typer.Exit(EXIT_USAGE) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def logs(
    deployment: str | None = typer.Argument(None, help="Only this deployment's runners."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new lines."),
    runner: str | None = typer.Option(None, "--runner", help="Only this runner."),
    since: str | None = typer.Option(None, help="Lines since: 10m, 2h, 1d or ISO time."),
    tail: int = typer.Option(100, help="Lines of each log to start with (without --since)."),
) -> None:
    """Log lines of the platform's processes, a deployment's runners, or one runner."""
    api = Api()
    params: dict[str, str | float | int] = {"tail": tail}
    if deployment:
        params["deployment"] = deployment
    if runner:
        params["runner"] = runner
    if since:
        params["since_s"] = parse_since(since, time.time())
    labelled = runner is None
    while True:
        body = api.call("GET", "/v1/logs", params=params)
        for line in body["data"]:
            print(f"{line['source']}: {line['line']}" if labelled else line["line"], flush=True)
        if not follow:
            return
        params = {k: v for k, v in params.items() if k not in ("since_s", "tail")}
        params["cursor"] = body["cursor"]
        time.sleep(_FOLLOW_POLL_S)
