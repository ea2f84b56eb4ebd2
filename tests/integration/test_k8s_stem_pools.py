"""Pre-warmed capacity on Kubernetes: the real controller over real Redis and a
KubernetesLauncher on kmock's emulator keeps each node pool's stems (EBB_STEM_POOLS): stem
pods pinned to their pool's nodes, holding its GPUs; a stem pod that fails is replaced in
its pool; a deployment takes the waiting stem on a node whose prefetcher says it holds
the weights, from a pool with the GPUs its engine needs (tensor parallel size)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
from support import wait_until
from support.k8s_emulator import emulator

from ebb.coldstart.controller import Controller
from ebb.coldstart.k8s_pods import LABEL_POOL, PodTemplate, pod_name
from ebb.coldstart.launch_k8s import KubernetesLauncher
from ebb.coldstart.launchers import gpus_for_deployments, node_source
from ebb.config import Settings
from ebb.launching.tiers import Tier
from ebb.queue.connection import async_client
from ebb.queue.node_caches import publish_node_cache
from ebb.queue.platform import PlatformState
from ebb.queue.runner_side import RunnerQueue
from ebb.queue.schema import DeploymentSpec, EngineSpec, RunnerState

pytestmark = pytest.mark.integration

NS = "ebb"
TEMPLATE = PodTemplate(namespace=NS, image="ebb:test", platform="pools")
POOLS = '{"gpu-a": {"stems": 2, "gpus": 2}, "cpu": 1}'


def kubelet_runs(api, runner_id: str, node: str) -> None:
    """What the scheduler and the kubelet would do: bind the pod, run its container."""
    api.patch_namespaced_pod(pod_name(runner_id), NS, {"spec": {"nodeName": node}})
    status = {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "runner",
                "state": {"running": {}},
                "image": TEMPLATE.image,
                "imageID": "",
                "ready": False,
                "restartCount": 0,
            }
        ],
    }
    api.patch_namespaced_pod_status(pod_name(runner_id), NS, {"status": status})


def kubelet_fails(api, runner_id: str) -> None:
    state = {"terminated": {"exitCode": 1, "reason": "Error"}}
    status = {
        "phase": "Failed",
        "containerStatuses": [
            {
                "name": "runner",
                "state": state,
                "image": TEMPLATE.image,
                "imageID": "",
                "ready": False,
                "restartCount": 0,
            }
        ],
    }
    api.patch_namespaced_pod_status(pod_name(runner_id), NS, {"status": status})


def stem_pods(api) -> dict[str, object]:
    """runner id -> pod, of the stems (pods with a pool label) still there."""
    pods = api.list_namespaced_pod(NS).items
    return {
        p.metadata.labels["ebb.io/runner-id"]: p for p in pods if LABEL_POOL in p.metadata.labels
    }


async def live_stems(state: PlatformState) -> dict[str, str]:
    """runner id -> pool of the live stems' records."""
    return {
        r.runner_id: r.pool
        for r in await state.runners()
        if r.state.is_live and r.deployment == "" and r.pool
    }


@pytest.fixture
def k8s():
    with emulator() as api:
        yield api


async def test_the_controller_keeps_each_pools_stems_and_hands_the_best_one_out(
    k8s, redis_url, tmp_path
):
    settings = Settings(
        home=tmp_path / "home",
        redis_url=redis_url,
        launcher="kubernetes",
        stem_pools=POOLS,
        fork_server=False,
        controller_poll_s=0.1,
    )
    sync = redis.Redis.from_url(redis_url)
    state = PlatformState(async_client(redis_url))
    pods = KubernetesLauncher(k8s, TEMPLATE, gpus_for=lambda d: 2 if d else 0, watch_timeout_s=1)
    launcher = pods
    controller = Controller(settings, state, launcher, nodes=node_source(settings, launcher))

    # 1. Each pool gets its stems, pinned to its nodes, with its GPUs; once.
    await controller.reconcile()
    await controller.reconcile()
    stems = stem_pods(k8s)
    assert sorted(p.metadata.labels[LABEL_POOL] for p in stems.values()) == [
        "cpu",
        "gpu-a",
        "gpu-a",
    ]
    for pod in stems.values():
        pool = pod.metadata.labels[LABEL_POOL]
        assert pod.spec.node_selector == {"ebb.io/pool": pool}
        requests = pod.spec.containers[0].resources.requests or {}
        assert requests.get("nvidia.com/gpu") == ("2" if pool == "gpu-a" else None)
        env = {e.name: e for e in pod.spec.containers[0].env}
        assert env["EBB_NODE_NAME"].value_from.field_ref.field_path == "spec.nodeName"
    assert sorted((await live_stems(state)).values()) == ["cpu", "gpu-a", "gpu-a"]

    # 2. A stem pod that fails is replaced in its own pool.
    doomed = next(rid for rid, p in stems.items() if p.metadata.labels[LABEL_POOL] == "gpu-a")
    kubelet_fails(k8s, doomed)

    async def replaced() -> bool:
        await controller.reconcile()
        stems_now = await live_stems(state)
        return doomed not in stems_now and sorted(stems_now.values()) == ["cpu", "gpu-a", "gpu-a"]

    await until(replaced, 10, "the failed stem replaced in pool gpu-a")
    failed = [r for r in await state.runners() if r.runner_id == doomed]
    assert failed[0].state is RunnerState.FAILED

    # 3. The stems run and wait on their nodes; node n2's cache holds the weights. n2's
    # stem is the newer one: oldest-first alone would pick n1's.
    nodes = {"cpu": iter(["c1"]), "gpu-a": iter(["n1", "n2"])}
    where: dict[str, str] = {}
    launched = {r.runner_id: r.launched_ms for r in await state.runners()}
    pools = await live_stems(state)
    for runner_id, pool in sorted(pools.items(), key=lambda kv: (launched[kv[0]], kv[0])):
        where[runner_id] = next(nodes[pool])
        kubelet_runs(k8s, runner_id, where[runner_id])
        # What the stem's own process does once it imported the engine.
        side = RunnerQueue(sync, runner_id, lease_ttl_s=5, result_ttl_s=60)
        side.set_fields(state=RunnerState.PREWARMED, node=where[runner_id])
        side.offer_as_stem()
    wait_until(lambda: all(pods.alive(r) for r in where), 10, "the stem pods running")
    publish_node_cache(sync, "n2", ["s3://m/llama"], now_ms=int(time.time() * 1000), ttl_ms=60_000)
    publish_node_cache(sync, "n1", [], now_ms=int(time.time() * 1000), ttl_ms=60_000)

    # 4. A deployment needing 2 GPUs (tensor parallel) takes the stem on n2, not the CPU one.
    spec = DeploymentSpec(
        name="llama",
        source="s3://m/llama",
        min_replicas=1,
        engine=EngineSpec(tensor_parallel_size=2),
    )
    await state.put_deployment(spec)
    await controller.reconcile()
    by_node = {where[r.runner_id]: r for r in await state.runners() if r.runner_id in where}
    assert by_node["n2"].deployment == "llama" and by_node["n2"].assigned_ms > 0
    assert by_node["n1"].deployment == "" and by_node["c1"].deployment == ""
    told = RunnerQueue(sync, by_node["n2"].runner_id, lease_ttl_s=5, result_ttl_s=60)
    assert told.wait_for_assignment(timeout_s=1) == "llama"
    launcher.stop_all(grace_s=0)
    await state.redis.aclose()
    sync.close()


async def until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.05)


def test_a_runner_pod_requests_its_deployments_tensor_parallel_gpus(k8s, redis_url):
    specs = {
        spec.name: spec
        for spec in (
            DeploymentSpec(
                name="tp4", source="s3://m/big", engine=EngineSpec(tensor_parallel_size=4)
            ),
            DeploymentSpec(name="plain", source="s3://m/small"),
        )
    }
    # The specs of the runners the controller decided to start (executor.DecidedSpecs).
    per_runner = gpus_for_deployments(specs.get, 1)  # EBB_K8S_GPUS_PER_RUNNER=1
    assert [per_runner(d) for d in ("tp4", "plain", None)] == [4, 1, 0]
    pods = KubernetesLauncher(
        k8s, TEMPLATE, gpus_for=lambda d: int(per_runner(d)), watch_pods=False
    )
    for runner_id, deployment in (("r-tp4", "tp4"), ("r-plain", "plain"), ("r-stem", None)):
        pods.launch(runner_id, deployment, Tier.FRESH if deployment else Tier.PREWARMED)
    found = {p.metadata.labels["ebb.io/runner-id"]: p for p in k8s.list_namespaced_pod(NS).items}
    resources = {rid: found[rid].spec.containers[0].resources for rid in found}
    assert (
        resources["r-tp4"].requests["nvidia.com/gpu"]
        == "4"
        == resources["r-tp4"].limits["nvidia.com/gpu"]
    )
    assert resources["r-plain"].limits["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in resources["r-stem"].requests
    pods.stop_all(grace_s=0)
