"""CLI: async jobs (list, show, submit, cancel) and the webhook signing secret."""

from __future__ import annotations

import time

import typer
from rich.table import Table

from ebb.cli.api import EXIT_REFUSED, Api, JsonOpt, console, err_console, print_json

jobs_app = typer.Typer(
    help="Async jobs: list them, or show, submit and cancel one.", invoke_without_command=True
)

_SETTLED = ("succeeded", "failed", "cancelled", "expired")


def _when(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else ""


def _jobs_table(rows: list[dict]) -> Table:
    table = Table("id", "model", "status", "created", "attempts", "tokens", "webhook")
    for job in rows:
        usage = job["usage"] or {}
        deliveries = job.get("deliveries")
        webhook = job["webhook"]["url"] if job["webhook"] else ""
        if deliveries:
            webhook = ", ".join(f"{d['event']}:{d['status']}" for d in deliveries)
        table.add_row(
            job["id"],
            job["model"],
            job["status"],
            _when(job["created_at"]),
            str(job["attempts"]),
            str(usage.get("total_tokens", "")),
            webhook,
        )
    return table


@jobs_app.callback()
def jobs(
    ctx: typer.Context,
    status: str | None = typer.Option(None, help="Only jobs in this status."),
    limit: int = typer.Option(20, help="How many, newest first."),
    as_json: bool = JsonOpt,
) -> None:
    """List your jobs, newest first."""
    if ctx.invoked_subcommand is not None:
        return
    params: dict[str, object] = {"limit": limit}
    if status:
        params["status"] = status
    body = Api().call("GET", "/v1/jobs", params=params)
    if as_json:
        print_json(body)
    else:
        console.print(_jobs_table(body["data"]))


@jobs_app.command("show")
def show(job_id: str, as_json: bool = JsonOpt) -> None:
    """A job with its result and every webhook delivery attempt."""
    _print_job(Api().call("GET", f"/v1/jobs/{job_id}"), as_json)


@jobs_app.command("submit")
def submit(
    model: str = typer.Argument(..., help="The deployment to run it on."),
    prompt: str = typer.Option(..., "--prompt", help="The user message (or the prompt)."),
    completions: bool = typer.Option(
        False, "--completions", help="A plain completion instead of a chat."
    ),
    max_tokens: int | None = typer.Option(None, "--max-tokens"),
    webhook: str | None = typer.Option(None, "--webhook", help="URL to notify."),
    ttl: int | None = typer.Option(None, "--ttl", help="Seconds it may wait to start."),
    idempotency_key: str | None = typer.Option(None, "--idempotency-key"),
    wait: bool = typer.Option(False, "--wait", help="Wait until it is settled."),
    as_json: bool = JsonOpt,
) -> None:
    """Submit a job; its id is printed at once (or its result with --wait)."""
    body: dict[str, object] = (
        {"prompt": prompt} if completions else {"messages": [{"role": "user", "content": prompt}]}
    )
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    payload: dict[str, object] = {
        "model": model,
        "endpoint": "completions" if completions else "chat.completions",
        "body": body,
    }
    if webhook:
        payload["webhook"] = {"url": webhook}
    if ttl:
        payload["ttl_s"] = ttl
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    api = Api()
    job = api.call("POST", "/v1/jobs", json=payload, headers=headers)
    if wait:
        with err_console.status(f"waiting for {job['id']}"):
            while job["status"] not in _SETTLED:
                time.sleep(0.5)
                job = api.call("GET", f"/v1/jobs/{job['id']}")
    _print_job(job, as_json)
    if job["status"] in ("failed", "expired"):
        raise typer.Exit(EXIT_REFUSED)


@jobs_app.command("cancel")
def cancel(job_id: str, as_json: bool = JsonOpt) -> None:
    """Cancel a queued job (it never runs) or a running one (aborted, billed so far)."""
    _print_job(Api().call("DELETE", f"/v1/jobs/{job_id}"), as_json)


@jobs_app.command("secret")
def secret(
    rotate: bool = typer.Option(False, "--rotate", help="Make a new secret."),
    overlap: float | None = typer.Option(
        None, "--overlap", help="Seconds the old secret stays valid after --rotate."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """The webhook signing secret (whsec_...) that verifies your deliveries."""
    api = Api()
    if rotate:
        body = {} if overlap is None else {"overlap_s": overlap}
        answer = api.call("POST", "/v1/webhooks/secret/rotate", json=body)
    else:
        answer = api.call("GET", "/v1/webhooks/secret")
    if as_json:
        print_json(answer)
        return
    console.print(answer["secret"])
    if answer["previous_secret_expires_at"]:
        console.print(f"previous secret valid until {_when(answer['previous_secret_expires_at'])}")


def _print_job(job: dict, as_json: bool) -> None:
    if as_json:
        print_json(job)
        return
    console.print(_jobs_table([job]))
    if job["error"]:
        console.print(f"[red]{job['error']['code']}:[/] {job['error']['message']}")
    for choice in (job["result"] or {}).get("choices", []):
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        console.print(text)
