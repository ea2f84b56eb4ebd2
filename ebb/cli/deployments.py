"""CLI: deploy, list, scale and remove deployments; platform status."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from ebb.cli import deployment_options as opts
from ebb.cli.api import EXIT_USAGE, Api, JsonObject, JsonOpt, console, err_console, print_json
from ebb.cli.rollouts import parse_env, wait_for_version
from ebb.cli.weights import print_cache, wait_for_weights

deployments_app = typer.Typer(
    help="List deployments; show or delete one.", invoke_without_command=True
)


def _deployments_table(rows: list[JsonObject]) -> Table:
    table = Table("name", "status", "ready", "starting", "queue", "min/max", "idle s", "source")
    for d in rows:
        r = d["replicas"]
        starting = r.get("starting", 0) + r.get("loading", 0) + r.get("prewarmed", 0)
        table.add_row(
            d["name"],
            d["status"],
            str(r.get("ready", 0)),
            str(starting),
            str(d["queue_depth"]),
            f"{d['min_replicas']}/{d['max_replicas']}",
            f"{d['idle_timeout_s']:g}",
            d.get("source", "—"),  # tenants are not shown sources
        )
    return table


DEPLOY_OPTIONS = opts.OptionSet(*opts.SETTINGS, *opts.ADMIN, *opts.ADAPTER)
SCALE_OPTIONS = opts.OptionSet(*opts.SETTINGS)


@DEPLOY_OPTIONS.command
def deploy(
    name: str = typer.Argument(..., help="Deployment name, used as the API's model name."),
    source: str = typer.Option(..., "--source", help="Weights URI: gguf:PKG/FILE, a path, ..."),
    options: opts.Given = opts.NONE_GIVEN,
    wait: bool = typer.Option(True, help="Wait until the weights are in the cache."),
    env: list[str] | None = typer.Option(
        None, "--env", help="NAME=VALUE in the version's environment (stored encrypted)."
    ),
    env_file: Path | None = typer.Option(None, help="NAME=VALUE lines for the environment."),
    create_only: bool = typer.Option(
        False, "--create-only", help="Refuse if the name exists instead of a new version."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Deploy a model, or a new version of an existing one (no traffic until `ebb
    rollout`); its weights are prefetched so the first cold start is a cache hit.

    Every field of POST /v1/deployments has an option (unset: the platform's default). A
    tenant key deploys its own, within its quota; prices and sharing are the admin's.
    """
    body = {"name": name, "source": source, **DEPLOY_OPTIONS.body(options)}
    if (env_vars := parse_env(env, env_file)) is not None:
        body["env"] = env_vars
    api = Api()
    answer = api.call(
        "POST",
        "/v1/deployments",
        json=body,
        headers={"If-None-Match": "*"} if create_only else {},
    )
    if version := answer.get("deployed_version"):
        history = wait_for_version(api, name, version) if wait else answer
        if as_json:
            print_json(history)
        else:
            console.print(
                f"deployed version {version} of [bold]{name}[/] (no traffic yet); move "
                f"traffic to it with 'ebb rollout {name}' (or --canary PCT)"
            )
        return
    if wait:
        answer = wait_for_weights(api, name)
    if as_json:
        print_json(answer)
    else:
        console.print(f"deployed [bold]{name}[/] ({answer['status']}); call it as model={name!r}")


@SCALE_OPTIONS.command
def scale(name: str, options: opts.Given = opts.NONE_GIVEN, as_json: bool = JsonOpt) -> None:
    """Change a deployment's scaling, queue and admission limits, engine or serving
    options (prices and owner: 'ebb price'; sharing: 'ebb deployments share')."""
    changes = SCALE_OPTIONS.body(options)
    if not changes:
        err_console.print("nothing to change: pass --min, --max, --idle-timeout or another option")
        raise typer.Exit(EXIT_USAGE)
    body = Api().call("PATCH", f"/v1/deployments/{name}", json=changes)
    if as_json:
        print_json(body)
    else:
        console.print(_deployments_table([body]))


@deployments_app.callback()
def deployments(ctx: typer.Context, as_json: bool = JsonOpt) -> None:
    """List deployments with their replicas and queues."""
    if ctx.invoked_subcommand is not None:
        return
    body = Api().call("GET", "/v1/deployments")
    if as_json:
        print_json(body)
    else:
        console.print(_deployments_table(body["data"]))


@deployments_app.command("share")
def share_deployment(
    name: str,
    tenants: list[str] | None = typer.Option(
        None, "--tenant", help="A tenant that may call it (repeat; replaces the list)."
    ),
    public: bool = typer.Option(False, "--public", help="Every tenant may call it."),
    private: bool = typer.Option(False, "--private", help="Only its owner and --tenant."),
    as_json: bool = JsonOpt,
) -> None:
    """Who besides its owner may see and call a deployment (the admin's)."""
    if public and private:
        raise typer.BadParameter("give --public or --private, not both")
    patch: dict[str, object] = {}
    if tenants is not None:
        patch["shared_with"] = [t for t in tenants if t]  # --tenant '' clears the list
    if public or private:
        patch["visibility"] = "public" if public else "private"
    if not patch:
        raise typer.BadParameter("give --tenant, --public or --private")
    body = Api().call("PATCH", f"/v1/deployments/{name}", json=patch)
    if as_json:
        print_json(body)
        return
    shared = ", ".join(body["shared_with"]) or "no other tenant"
    console.print(f"{name}: {body['visibility']}; shared with {shared}")


@deployments_app.command("rm", hidden=True)  # the old word for `delete`, kept for scripts
def remove_deployment(name: str) -> None:
    """Remove a deployment; its runners drain and exit."""
    Api().call("DELETE", f"/v1/deployments/{name}")
    console.print(f"removed {name}")


def _no_gpus(note: str | None) -> str:
    # A host without NVIDIA's driver is not an error: its runners serve on the CPU.
    if not note or note.startswith("NVML") or "nvidia-ml-py" in note:
        return "no NVIDIA GPU (runners serve on the CPU)"
    return f"no GPUs ({note})"


def print_gpus(hosts: list[JsonObject]) -> None:
    """Each host's GPUs: memory free and reserved by runners, load, temperature."""
    gib = 1024**3
    for host in hosts:
        if not host["devices"]:
            console.print(f"{host['host']}: {_no_gpus(host['note'])}")
            continue
        table = Table(
            "gpu",
            "name",
            "free GiB",
            "reserved GiB",
            "total GiB",
            "util",
            "temp",
            "runners",
            title=f"GPUs of {host['host']}",
        )
        for d in host["devices"]:
            table.add_row(
                str(d["index"]),
                d["name"],
                f"{d['free_bytes'] / gib:.1f}",
                f"{d['reserved_bytes'] / gib:.1f}",
                f"{d['total_bytes'] / gib:.1f}",
                f"{d['utilization_pct']} %",
                f"{d['temperature_c']} °C",
                ", ".join(d["runners"]),
            )
        console.print(table)


def print_processes(processes: list[JsonObject]) -> None:
    """Each platform process's memory; PSS shares pages between processes (a fork server
    and its runners) out among them, so the PSS column adds up where RSS overcounts."""
    if not processes:
        return
    table = Table("process", "host", "pid", "runner", "RSS MiB", "PSS MiB")
    for p in processes:
        pss = p["pss_bytes"]
        table.add_row(
            p["role"],
            p["host"],
            str(p["pid"]),
            p["runner_id"] or "",
            f"{p['rss_bytes'] / 2**20:.1f}",
            "" if pss is None else f"{pss / 2**20:.1f}",
        )
    known = [p["pss_bytes"] for p in processes if p["pss_bytes"] is not None]
    console.print(table)
    console.print(f"processes: {len(processes)}, PSS {sum(known) / 2**20:.1f} MiB in all")


def status(as_json: bool = JsonOpt) -> None:
    """The platform at a glance: deployments, runners, cold starts, the weight cache."""
    api = Api()
    body = api.call("GET", "/v1/deployments")
    cache = api.get_if_allowed("/v1/weights")  # the admin's view; tenants see the rest
    platform = api.get_if_allowed("/v1/status")
    if as_json:
        print_json({**body, "weights_cache": cache, "platform": platform})
        return
    if platform is not None:
        pool = platform["pool"]
        console.print(
            f"pre-warmed pool: {pool['prewarmed']} ready, {pool['starting']} starting "
            f"(target {pool['target']}); fork server: {platform['fork_server']}"
        )
        if memory := platform.get("redis"):
            console.print(
                f"redis memory: {memory['used_memory_bytes'] / 2**20:.1f} MiB used "
                f"(peak {memory['used_memory_peak_bytes'] / 2**20:.1f} MiB)"
            )
        print_gpus(platform.get("gpus", []))
        print_processes(platform.get("processes", []))
    console.print(_deployments_table(body["data"]))
    runners = Table("deployment", "runner", "state", "tier", "pid", "error")
    for d in body["data"]:
        for r in d["runners"]:
            runners.add_row(
                d["name"], r["id"], r["state"], r["tier"], str(r["pid"]), r["error"] or ""
            )
        for tier, phases in d["cold_start_ms"].items():
            console.print(f"{d['name']}: cold start via {tier} ≈ {phases.get('total', 0):.0f} ms")
        if d["error"]:
            console.print(f"[red]{d['name']}: {d['error']}")
    console.print(runners)
    if cache is not None:
        print_cache(cache)
