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
from ebb.config import Settings
from ebb.launching.tiers import Tier
from ebb.services import SERVICES, configure_logging

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
# The platform's own processes (`python -m ebb ROLE` runs them without this module).
for service in SERVICES.values():
    app.command(hidden=True)(service)


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
def runner(
    runner_id: str = typer.Option(...),
    tier: Tier = typer.Option(Tier.FRESH),
    deployment: str | None = typer.Option(None),
) -> None:
    """Run one runner (started by the controller)."""
    from ebb.runners.process import run_runner

    configure_logging("runner")
    raise typer.Exit(run_runner(Settings(), runner_id, deployment, tier))


@app.command(hidden=True)
def prepare(source: str = typer.Argument(...)) -> None:
    """Prepare one source's weights in the cache, reporting on stdout (started by the
    controller's preparer)."""
    from ebb.process_guard import exit_when_orphaned
    from ebb.weights_cache.preparation import run_preparation

    configure_logging()
    exit_when_orphaned()
    raise typer.Exit(run_preparation(source, Settings().weights_dir))


@app.command("fork-server", hidden=True)
def fork_server() -> None:
    """Import the engine once and fork runners on request (started by the controller)."""
    from ebb.runners.fork_server import serve_forks

    configure_logging("runner")
    raise typer.Exit(serve_forks(Settings()))


def main() -> None:
    app()
