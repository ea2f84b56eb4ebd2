"""The launcher a controller process runs runners with, as EBB_LAUNCHER says."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from ebb.coldstart.environments import child_environment
from ebb.coldstart.launcher import Launcher, LocalProcessLauncher, NoWarmStarts, WarmStarts
from ebb.coldstart.world_reader import NodeLauncher
from ebb.config import Settings
from ebb.launching.stem_pools import runner_gpus
from ebb.queue.schema import DeploymentSpec

if TYPE_CHECKING:
    from ebb.coldstart.k8s_pods import RunnerShape

SpecOf = Callable[[str], DeploymentSpec | None]


def make_launcher(settings: Settings, spec_of: SpecOf) -> tuple[Launcher, WarmStarts]:
    """The launcher and its warm capacity: local processes and their fork server, or
    Kubernetes pods (in-cluster credentials; no fork server, stems are pods), or Ray
    actors. `spec_of(deployment)`: the spec of a deployment the controller decided to
    start a runner of (`executor.DecidedSpecs`): what a cluster launcher shapes its pod or
    actor from. Where a runner goes is the controller's decision (`plan`), passed to
    `launch_on`."""
    if settings.launcher == "kubernetes":
        return _kubernetes(settings, spec_of), NoWarmStarts()
    if settings.launcher == "ray":
        return _ray(settings, spec_of), NoWarmStarts()
    local = LocalProcessLauncher(settings)
    return local, local


def _kubernetes(settings: Settings, spec_of: SpecOf) -> Launcher:
    from kubernetes import client, config

    from ebb.coldstart.k8s_pods import PodTemplate
    from ebb.coldstart.k8s_shapes import runner_shape
    from ebb.coldstart.launch_k8s import KubernetesLauncher, read_runner_image
    from ebb.engines import EngineRegistry

    config.load_incluster_config()
    engines = EngineRegistry.from_settings(settings)

    def shape_for(deployment: str | None) -> RunnerShape:
        spec = None if deployment is None else spec_of(deployment)
        return runner_shape(settings, engines, spec)

    api = client.CoreV1Api()
    template = PodTemplate.from_settings(settings)
    if settings.k8s_runner_template:
        image = read_runner_image(api, settings.k8s_namespace, settings.k8s_runner_template)
        template = dataclasses.replace(template, image=image)
    return KubernetesLauncher(
        api,
        template,
        shape_for=shape_for,
        unschedulable_after_s=settings.k8s_unschedulable_timeout_s,
    )


def node_source(settings: Settings, launcher: Launcher) -> NodeLauncher | None:
    """The launcher whose nodes the plan may prefer one of: Kubernetes only. A pod's
    preference is a preference (its scheduler still places it elsewhere when the node is
    full); Ray's soft node affinity waits for a feasible node that is busy, and Ray's node
    list holds its GPUs in total, not free: Ray places its runners itself."""
    if settings.launcher == "kubernetes" and isinstance(launcher, NodeLauncher):
        return launcher
    return None


def gpus_for_deployments(spec_of: SpecOf, default: float) -> Callable[[str | None], float]:
    """The GPUs one runner of a deployment asks its node for (`stem_pools.runner_gpus`:
    its engine's tensor parallel size, else `default`); a stem launched without a pool
    none (a pool's stems: their pool's)."""

    def gpus_for(deployment: str | None) -> float:
        if deployment is None:
            return 0
        return runner_gpus(spec_of(deployment), default)

    return gpus_for


def _ray(settings: Settings, spec_of: SpecOf) -> Launcher:
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
    gpus_for = gpus_for_deployments(spec_of, settings.ray_gpus_per_runner)
    return RayLauncher(
        child_environment(settings),
        settings.logs_dir,
        # Stems, too, go where runners go: they load there once assigned.
        resources_for=lambda deployment: resources,
        gpus_for=gpus_for,
    )
