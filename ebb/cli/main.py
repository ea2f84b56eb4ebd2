"""The `ebb` command line: run the platform's processes and operate it over its HTTP API."""

from __future__ import annotations

import typer

from ebb.cli.batches import batches_app
from ebb.cli.chat import chat
from ebb.cli.deployment_show import delete_deployment, show_deployment
from ebb.cli.deployments import deploy, deployments_app, scale, status
from ebb.cli.jobs import jobs_app
from ebb.cli.keys import keys_app
from ebb.cli.logs import logs
from ebb.cli.rollouts import history, rollback, rollout
from ebb.cli.tenants import tenants_app
from ebb.cli.usage import price, usage_app
from ebb.coldstart.tiers import Tier
from ebb.config import Settings

app = typer.Typer(
    name="ebb",
    help="Serverless, scale-to-zero LLM inference.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(keys_app, name="keys")
app.add_typer(deployments_app, name="deployments")
app.add_typer(jobs_app, name="jobs")
app.add_typer(batches_app, name="batches")
app.add_typer(usage_app, name="usage")
app.add_typer(tenants_app, name="tenants")
for command in (deploy, scale, status, price, chat, logs, rollout, rollback):
    app.command()(command)
deployments_app.command("show")(show_deployment)
deployments_app.command("history")(history)
deployments_app.command("delete")(delete_deployment)


def _logging(service: str = "") -> None:
    """This process's logging, and its tracing when EBB_OTLP_ENDPOINT is set."""
    from ebb import logs, tracing

    settings = Settings()
    logs.configure(settings.log_format)
    if service:
        tracing.setup(
            settings.otlp_endpoint, f"ebb-{service}", sample_ratio=settings.otlp_sample_ratio
        )


@app.command()
def up(
    default_model: bool = typer.Option(True, help="Deploy the default model."),
) -> None:
    """Run the whole platform on this machine until Ctrl-C."""
    from ebb import logs
    from ebb.up import run_up

    settings = Settings()
    logs.configure_up(settings.logs_dir / "up.log", settings.log_format)
    raise typer.Exit(run_up(settings, default_model=default_model))


@app.command(hidden=True)
def frontdoor() -> None:
    """Run the HTTP frontdoor (started by `ebb up`)."""
    import uvicorn

    from ebb.process_guard import exit_when_orphaned

    settings = Settings()
    exit_when_orphaned()
    if settings.frontdoor_workers > 1:
        # uvicorn's supervisor binds the port once and starts the workers on that socket
        # (restarting any that dies); each worker builds its app with `frontdoor_worker_app`.
        from ebb.process_memory import start_memory_reporter

        _logging()
        start_memory_reporter(settings.redis_url or "", "frontdoor-supervisor")
        uvicorn.run(
            "ebb.cli.main:frontdoor_worker_app",
            factory=True,
            workers=settings.frontdoor_workers,
            host=settings.host,
            port=settings.port,
            log_level="warning",
            timeout_graceful_shutdown=30,
        )
        return
    from ebb.frontdoor.app import create_app

    _logging("frontdoor")
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        timeout_graceful_shutdown=30,
    )


def frontdoor_worker_app():  # -> FastAPI; untyped so that this module imports no FastAPI
    """One of EBB_FRONTDOOR_WORKERS frontdoor processes: its logging, and its app."""
    from ebb.frontdoor.app import create_app
    from ebb.process_guard import exit_when_orphaned

    _logging("frontdoor")
    exit_when_orphaned()  # its supervisor gone (killed), it goes too
    return create_app(Settings())


@app.command(hidden=True)
def coldstart() -> None:
    """Run the coldstart controller (started by `ebb up`)."""
    from ebb.coldstart.main import run_controller

    _logging()
    run_controller(Settings())


@app.command(hidden=True)
def billing() -> None:
    """Run the ledger consumer (started by `ebb up`)."""
    from ebb.billing.main import run_billing

    _logging()
    run_billing(Settings())


@app.command(hidden=True)
def webhooks() -> None:
    """Run the job collector and webhook delivery worker (started by `ebb up`)."""
    from ebb.webhooks.main import run_worker

    _logging("webhooks")
    run_worker(Settings())


@app.command(hidden=True)
def runner(
    runner_id: str = typer.Option(...),
    tier: Tier = typer.Option(Tier.FRESH),
    deployment: str | None = typer.Option(None),
) -> None:
    """Run one runner (started by the controller)."""
    from ebb.runners.process import run_runner

    _logging("runner")
    raise typer.Exit(run_runner(Settings(), runner_id, deployment, tier))


@app.command(hidden=True)
def prepare(source: str = typer.Argument(...)) -> None:
    """Prepare one source's weights in the cache, reporting on stdout (started by the
    controller's preparer)."""
    from ebb.process_guard import exit_when_orphaned
    from ebb.weights_cache.preparation import run_preparation

    _logging()
    exit_when_orphaned()
    raise typer.Exit(run_preparation(source, Settings().weights_dir))


@app.command(hidden=True)
def prefetch() -> None:
    """Keep this node's weight cache warm for the deployments and publish what it holds
    (one per node: a DaemonSet on Kubernetes). Stops on SIGTERM."""
    import signal
    import threading

    from ebb.coldstart.prefetch import Prefetcher, node_annotator, node_name
    from ebb.queue.connection import sync_client

    _logging("prefetch")
    settings = Settings()
    client = sync_client(settings.platform_redis_url("ebb prefetch"))
    annotate = node_annotator(node_name(settings)) if settings.prefetch_annotate_node else None
    prefetcher = Prefetcher(settings, client, annotate=annotate)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    prefetcher.run(stop)


@app.command("fork-server", hidden=True)
def fork_server() -> None:
    """Import the engine once and fork runners on request (started by the controller)."""
    from ebb.runners.fork_server import serve_forks

    _logging("runner")
    raise typer.Exit(serve_forks(Settings()))


def main() -> None:
    app()
