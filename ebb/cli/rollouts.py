"""CLI: a deployment's versions, rolling one out, promoting a canary, rolling back."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from ebb.cli.api import (
    EXIT_REFUSED,
    EXIT_USAGE,
    Api,
    JsonObject,
    JsonOpt,
    console,
    err_console,
    print_json,
)

_POLL_S = 0.5


def parse_env(pairs: list[str] | None, env_file: Path | None) -> dict[str, str] | None:
    """`NAME=VALUE` options and a dotenv-style file (`NAME=VALUE` lines, `#` comments);
    None when neither was given (a new version keeps the latest one's env)."""
    if not pairs and env_file is None:
        return None
    env: dict[str, str] = {}
    lines = env_file.read_text().splitlines() if env_file is not None else []
    for item in [*lines, *(pairs or [])]:
        item = item.strip()
        if not item or item.startswith("#"):
            continue
        name, sep, value = item.partition("=")
        if not sep:
            err_console.print(f"env entries look like NAME=VALUE, not {name!r}")
            raise typer.Exit(EXIT_USAGE)
        env[name.strip()] = value
    return env


def wait_for_version(api: Api, name: str, version: int, timeout_s: float = 1800) -> JsonObject:
    """Until the version's weights are in the cache (its deploy-time prefetch)."""
    deadline = time.monotonic() + timeout_s
    with console.status(f"{name} v{version}: preparing weights"):
        while True:
            body = api.call("GET", f"/v1/deployments/{name}/versions")
            [row] = [v for v in body["data"] if v["version"] == version]
            if row["weights"] == "failed":
                err_console.print(f"[red]weights of {name} v{version} failed")
                raise typer.Exit(EXIT_REFUSED)
            if row["weights"] in ("ready", "unknown") or time.monotonic() > deadline:
                return body
            time.sleep(_POLL_S)


def _history_table(body: JsonObject) -> Table:
    table = Table("version", "traffic", "ready", "weights", "source", "env", "created")
    for v in body["data"]:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v["created_at_s"]))
        table.add_row(
            str(v["version"]),
            f"{v['traffic_pct']} %",
            f"{v['ready_replicas']}/{v['replicas']}",
            v["weights"],
            v["source"],
            ", ".join(v["env"]) or "—",
            created,
        )
    return table


def _print(body: JsonObject, as_json: bool) -> None:
    if as_json:
        print_json(body)
        return
    console.print(_history_table(body))
    rollout = body.get("rollout")
    if rollout:
        console.print(
            f"rollout v{rollout['from_version']} → v{rollout['to_version']} "
            f"({rollout['strategy']}, steps {rollout['steps']}): {rollout['state']}"
            + (f" — {rollout['reason']}" if rollout.get("reason") else "")
        )


def history(name: str, as_json: bool = JsonOpt) -> None:
    """A deployment's versions, their traffic and the rollout in progress."""
    _print(Api().call("GET", f"/v1/deployments/{name}/versions"), as_json)


def rollout(
    name: str,
    version: int | None = typer.Option(None, help="The version to roll out (default: latest)."),
    canary: int | None = typer.Option(None, help="Canary: this percent of traffic first."),
    steps: str | None = typer.Option(None, help="Canary steps in percent, e.g. 10,50,100."),
    interval: float = typer.Option(
        0.0, help="Seconds per step, promoted automatically unless it does worse; 0: by hand."
    ),
    max_error_rate_increase: float = typer.Option(
        0.05, help="Automatic rollback: error rate this much above the old version's."
    ),
    max_ttft_increase_pct: float = typer.Option(
        50.0, help="Automatic rollback: p99 TTFT this many percent above the old version's."
    ),
    promote: bool = typer.Option(False, "--promote", help="Move a canary to its next step."),
    as_json: bool = JsonOpt,
) -> None:
    """Move traffic to a version: at once (default) once it has a ready runner, or as a
    canary in steps (--canary, --steps; --interval to promote automatically)."""
    api = Api()
    if promote:
        _print(api.call("POST", f"/v1/deployments/{name}/rollout/promote"), as_json)
        return
    body: JsonObject = {"version": version, "interval_s": interval}
    if canary is not None or steps:
        body["strategy"] = "canary"
        body["canary_pct"] = canary
        if steps:
            body["steps"] = [int(s) for s in steps.split(",") if s.strip()]
        body["max_error_rate_increase"] = max_error_rate_increase
        body["max_ttft_increase_pct"] = max_ttft_increase_pct
    _print(
        api.call(
            "POST",
            f"/v1/deployments/{name}/rollout",
            json={k: v for k, v in body.items() if v is not None},
        ),
        as_json,
    )


def rollback(name: str, as_json: bool = JsonOpt) -> None:
    """All traffic back to the version the last rollout started from."""
    _print(Api().call("POST", f"/v1/deployments/{name}/rollback"), as_json)
