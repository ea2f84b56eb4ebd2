"""The launcher a controller process runs runners with, as EBB_LAUNCHER says."""

from __future__ import annotations

import json

from ebb.coldstart.launcher import (
    Launcher,
    LocalProcessLauncher,
    NoWarmStarts,
    WarmStarts,
    child_environment,
)
from ebb.coldstart.placing import PreferringLauncher
from ebb.config import Settings
from ebb.queue.connection import sync_client
from ebb.queue.deployment_lookup import read_deployment


def make_launcher(settings: Settings) -> tuple[Launcher, WarmStarts]:
    """The launcher and its warm capacity: local processes and their fork server, or
    Kubernetes pods (in-cluster credentials; no fork server, stems are pods)."""
    if settings.launcher == "kubernetes":
        return _kubernetes(settings), NoWarmStarts()
    if settings.launcher == "ray":
        return _ray(settings), NoWarmStarts()
    local = LocalProcessLauncher(settings)
    return local, local


def _kubernetes(settings: Settings) -> Launcher:
    from kubernetes import client, config

    from ebb.coldstart.k8s_pods import PodTemplate
    from ebb.coldstart.launch_k8s import KubernetesLauncher

    config.load_incluster_config()
    template = PodTemplate(
        namespace=settings.k8s_namespace,
        image=settings.k8s_runner_image,
        platform=settings.k8s_platform,
        env_secret=settings.k8s_env_secret,
        weights_host_path=settings.k8s_weights_host_path,
        gpu_resource=settings.k8s_gpu_resource,
    )
    gpus = settings.k8s_gpus_per_runner

    def gpus_for(deployment: str | None) -> int:
        # A stem requests no GPU: it imports the engine, then loads onto its node's GPUs.
        return gpus if deployment else 0

    pods = KubernetesLauncher(client.CoreV1Api(), template, gpus_for=gpus_for)
    specs = sync_client(settings.platform_redis_url("ebb coldstart"))

    def source_of(deployment: str) -> str | None:
        spec = read_deployment(specs, deployment)
        return spec.source if spec else None

    return PreferringLauncher(pods, source_of=source_of, gpus_for=gpus_for)


def _ray(settings: Settings) -> Launcher:
    import ray

    from ebb.coldstart.launch_ray import NAMESPACE, RayLauncher

    host = settings.ray_address.rsplit(":", 1)[0]
    ray.init(
        address=settings.ray_address,
        namespace=NAMESPACE,
        log_to_driver=False,
        # The address this driver is reached at: the cluster's own (never guessed from the
        # machine's routable interfaces).
        _node_ip_address=None if host == "auto" else host,
    )
    resources = {k: float(v) for k, v in json.loads(settings.ray_runner_resources).items()}
    gpus = settings.ray_gpus_per_runner
    return RayLauncher(
        child_environment(settings),
        settings.logs_dir,
        # Stems, too, go where runners go: they load there once assigned.
        resources_for=lambda deployment: resources,
        gpus_for=lambda deployment: gpus if deployment else 0,
    )
