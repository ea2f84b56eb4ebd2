"""The platform's long-running processes, each started as `python -m ebb ROLE`.

`ebb up` and the Kubernetes manifests start the frontdoor, the coldstart controller, the
webhook worker, the billing consumer and the prefetcher this way. `ebb/__main__.py` runs
them from here without importing the command line: typer, rich and every command's
imports would cost each long-lived process ~12 MB of RSS it never uses. The same
functions are the CLI's hidden commands (`ebb frontdoor`, ...).
"""

from __future__ import annotations

from collections.abc import Callable

from ebb.config import Settings


def configure_logging(service: str = "") -> None:
    """This process's logging, and its tracing when EBB_OTLP_ENDPOINT is set."""
    from ebb import logs, tracing

    settings = Settings()
    logs.configure(settings.log_format)
    if service:
        tracing.setup(
            settings.otlp_endpoint, f"ebb-{service}", sample_ratio=settings.otlp_sample_ratio
        )


def frontdoor() -> None:
    """Run the HTTP frontdoor (started by `ebb up`)."""
    import uvicorn

    from ebb.frontdoor.head_timeout import HTTP_PROTOCOL
    from ebb.process_guard import exit_when_orphaned

    settings = Settings()
    exit_when_orphaned()
    if settings.frontdoor_workers > 1:
        # uvicorn's supervisor binds the port once and starts the workers on that socket
        # (restarting any that dies); each worker builds its app with `frontdoor_worker_app`.
        from ebb.process_memory import start_memory_reporter

        configure_logging()
        start_memory_reporter(settings.redis_url or "", "frontdoor-supervisor")
        from ebb.frontdoor.draining import run_workers

        run_workers(
            uvicorn.Config(
                "ebb.services:frontdoor_worker_app",
                factory=True,
                workers=settings.frontdoor_workers,
                host=settings.host,
                port=settings.port,
                log_level="warning",
                access_log=False,  # ebb.access writes one line per request (observe.py)
                timeout_graceful_shutdown=settings.frontdoor_drain_s,
                http=HTTP_PROTOCOL,  # closes connections whose head is not read in time
            )
        )
        return
    from ebb.frontdoor.app import create_app

    configure_logging("frontdoor")
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,  # ebb.access writes one line per request (observe.py)
        timeout_graceful_shutdown=settings.frontdoor_drain_s,
        http=HTTP_PROTOCOL,  # closes connections whose head is not read in time
    )


def frontdoor_worker_app():  # -> FastAPI; untyped so that this module imports no FastAPI
    """One of EBB_FRONTDOOR_WORKERS frontdoor processes: its logging, and its app."""
    from ebb.frontdoor.app import create_app
    from ebb.process_guard import exit_when_orphaned

    configure_logging("frontdoor")
    exit_when_orphaned()  # its supervisor gone (killed), it goes too
    return create_app(Settings())


def coldstart() -> None:
    """Run the coldstart controller (started by `ebb up`)."""
    from ebb.coldstart.main import run_controller

    configure_logging()
    run_controller(Settings())


def billing() -> None:
    """Run the ledger consumer (started by `ebb up`)."""
    from ebb.billing.main import run_billing

    configure_logging()
    run_billing(Settings())


def webhooks() -> None:
    """Run the job collector and webhook delivery worker (started by `ebb up`)."""
    import sys

    # httpx imports its own command line (click, rich, pygments: ~6 MB of RSS) when those
    # are installed, and does without it when they are not; this process never runs it.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    from ebb.webhooks.main import run_worker

    configure_logging("webhooks")
    run_worker(Settings())


def prefetch() -> None:
    """Keep this node's weight cache warm for the deployments and publish what it holds
    (one per node: a DaemonSet on Kubernetes). Stops on SIGTERM."""
    import signal
    import threading

    from ebb.coldstart.prefetch import Prefetcher, node_annotator, node_name
    from ebb.queue.connection import sync_client

    configure_logging("prefetch")
    settings = Settings()
    client = sync_client(settings.platform_redis_url("ebb prefetch"))
    annotate = node_annotator(node_name(settings)) if settings.prefetch_annotate_node else None
    prefetcher = Prefetcher(settings, client, annotate=annotate)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    prefetcher.run(stop)


# The services that take no options: `python -m ebb ROLE` runs these directly.
SERVICES: dict[str, Callable[[], None]] = {
    "frontdoor": frontdoor,
    "coldstart": coldstart,
    "webhooks": webhooks,
    "billing": billing,
    "prefetch": prefetch,
}
