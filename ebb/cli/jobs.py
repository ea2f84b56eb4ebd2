"""CLI: async jobs (list, show, submit, cancel) and the webhook signing secret."""

from __future__ import annotations

import time

import typer
from rich.table import Table

from ebb.cli.api import EXIT_REFUSED, Api, JsonObject, JsonOpt, console, err_console, print_json

jobs_app = typer.Typer(
    help="Async jobs: list them, or show, submit and cancel one.", invoke_without_command=True
)

_SETTLED = ("succeeded", "failed", "cancelled", "expired")


def _when(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else ""


def _jobs_table(rows: list[JsonObject]) -> Table:
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


StatusOpt = typer.Option(None, help="Only jobs in this status (queued, running, succeeded, ...).")
ModelOpt = typer.Option(None, help="Only jobs for this deployment.")
TenantOpt = typer.Option(None, help="This tenant's jobs (the admin; default: the key's own).")
LimitOpt = typer.Option(20, min=1, max=100, help="How many, newest first.")
AfterOpt = typer.Option(None, help="Older than this job id (the previous page's last).")


@jobs_app.callback()
def jobs(
    ctx: typer.Context,
    status: str | None = StatusOpt,
    model: str | None = ModelOpt,
    tenant: str | None = TenantOpt,
    limit: int = LimitOpt,
    after: str | None = AfterOpt,
    as_json: bool = JsonOpt,
) -> None:
    """List your jobs, newest first (the same as 'ebb jobs list')."""
    if ctx.invoked_subcommand is not None:
        return
    jobs_list(status, model, tenant, limit, after, as_json)


@jobs_app.command("list")
def jobs_list(
    status: str | None = StatusOpt,
    model: str | None = ModelOpt,
    tenant: str | None = TenantOpt,
    limit: int = LimitOpt,
    after: str | None = AfterOpt,
    as_json: bool = JsonOpt,
) -> None:
    """List jobs, newest first, filtered by status, model or (admin) tenant."""
    params = {"status": status, "model": model, "tenant": tenant, "limit": limit, "after": after}
    body = Api().call("GET", "/v1/jobs", params={k: v for k, v in params.items() if v})
    if as_json:
        print_json(body)
        return
    console.print(_jobs_table(body["data"]))
    if body["has_more"]:
        console.print(f"more: ebb jobs list --after {body['last_id']}")


@jobs_app.command("show")
def show(job_id: str, as_json: bool = JsonOpt) -> None:
    """A job with its result and every webhook delivery attempt."""
    _print_job(Api().call("GET", f"/v1/jobs/{job_id}"), as_json)


@jobs_app.command("submit")
def submit(
    model: str = typer.Argument(..., help="The deployment to run it on."),
    prompt: str = typer.Option(
        ..., "--prompt", help="The user message (or the prompt, or the text to embed)."
    ),
    completions: bool = typer.Option(
        False, "--completions", help="A plain completion instead of a chat."
    ),
    embeddings: bool = typer.Option(
        False, "--embeddings", help="The prompt's embedding (an embedding deployment)."
    ),
    max_tokens: int | None = typer.Option(None, "--max-tokens"),
    webhook: str | None = typer.Option(None, "--webhook", help="URL to notify."),
    ttl: int | None = typer.Option(None, "--ttl", help="Seconds it may wait to start."),
    idempotency_key: str | None = typer.Option(None, "--idempotency-key"),
    wait: bool = typer.Option(False, "--wait", help="Wait until it is settled."),
    as_json: bool = JsonOpt,
) -> None:
    """Submit a job; its id is printed at once (or its result with --wait)."""
    if completions and embeddings:
        raise typer.BadParameter("choose one of --completions and --embeddings")
    endpoint = "chat.completions"
    body: dict[str, object] = {"messages": [{"role": "user", "content": prompt}]}
    if completions:
        endpoint, body = "completions", {"prompt": prompt}
    elif embeddings:
        endpoint, body = "embeddings", {"input": prompt}
    if max_tokens is not None and not embeddings:
        body["max_tokens"] = max_tokens
    payload: dict[str, object] = {"model": model, "endpoint": endpoint, "body": body}
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
    tenant: str | None = typer.Option(None, help="This tenant's secret (the admin)."),
    as_json: bool = JsonOpt,
) -> None:
    """The webhook signing secret (whsec_...) that verifies your deliveries."""
    api = Api()
    params = {"tenant": tenant} if tenant else {}
    if rotate:
        body = {} if overlap is None else {"overlap_s": overlap}
        answer = api.call("POST", "/v1/webhooks/secret/rotate", json=body, params=params)
    else:
        answer = api.call("GET", "/v1/webhooks/secret", params=params)
    if as_json:
        print_json(answer)
        return
    console.print(answer["secret"])
    if answer["previous_secret_expires_at"]:
        console.print(f"previous secret valid until {_when(answer['previous_secret_expires_at'])}")


def _print_job(job: JsonObject, as_json: bool) -> None:
    if as_json:
        print_json(job)
        return
    console.print(_jobs_table([job]))
    if job["error"]:
        console.print(f"[red]{job['error']['code']}:[/] {job['error']['message']}")
    result = job["result"] or {}
    for choice in result.get("choices", []):
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        console.print(text)
    for item in result.get("data", []):  # embeddings: their size, not a wall of floats
        vector = item["embedding"]
        size = f"{len(vector)} dimensions" if isinstance(vector, list) else "base64"
        console.print(f"embedding {item['index']}: {size}")
