"""The node's weight prefetcher (`ebb prefetch`'s loop) over real Redis, a real weight
cache and real `ebb prepare` processes: it fetches every deployment's weights the node
lacks, once; publishes what the node holds in Redis (with an expiry) and on the node's
annotation in kmock's emulator, where the Kubernetes launcher's placement reads it."""

from __future__ import annotations

import time

import msgspec
import pytest
import redis
from support.k8s_emulator import emulator
from support.weights import write_servable_dir

from ebb.coldstart.k8s_pods import PodTemplate
from ebb.coldstart.launch_k8s import KubernetesLauncher
from ebb.coldstart.prefetch import Prefetcher, node_annotator, prepare_in_process
from ebb.config import Settings
from ebb.queue import keys
from ebb.queue.deployment_lookup import read_deployment
from ebb.queue.node_caches import read_node_caches
from ebb.queue.schema import DeploymentSpec
from ebb.weights_cache import cached_manifest

pytestmark = pytest.mark.integration


def put(client: redis.Redis, spec: DeploymentSpec) -> None:
    client.hset(keys.DEPLOYMENTS, spec.name, msgspec.json.encode(spec))
    assert read_deployment(client, spec.name) == spec


def test_the_prefetcher_fills_the_nodes_cache_once_and_says_what_it_holds(redis_url, tmp_path):
    first = str(write_servable_dir(tmp_path / "m1", seed=1))
    second = str(write_servable_dir(tmp_path / "m2", seed=2))
    client = redis.Redis.from_url(redis_url)
    put(client, DeploymentSpec(name="one", source=first))
    put(client, DeploymentSpec(name="fake", source="fake://m"))  # nothing to fetch
    settings = Settings(
        home=tmp_path / "home",
        redis_url=redis_url,
        node_name="node-a",
        prefetch_interval_s=5,
        test_engines=True,
    )
    prepared: list[str] = []
    with emulator() as k8s:
        k8s.create_node({"metadata": {"name": "node-a"}, "status": {"allocatable": {}}})
        prefetcher = Prefetcher(
            settings,
            client,
            prepare=lambda s: prepared.append(s) or prepare_in_process(settings, s),
            annotate=node_annotator("node-a", k8s),
        )
        assert prefetcher.pass_once() == [first]
        assert cached_manifest(first, settings.weights_dir) is not None
        # A new deployment: only its weights are fetched; nothing is fetched twice.
        put(client, DeploymentSpec(name="two", source=second))
        assert prefetcher.pass_once() == sorted([first, second])
        assert prefetcher.pass_once() == sorted([first, second])
        assert prepared == [first, second]

        now_ms = int(time.time() * 1000)
        assert read_node_caches(client, now_ms=now_ms) == {"node-a": frozenset({first, second})}
        assert read_node_caches(client, now_ms=now_ms + 16_000) == {}, "expires after 3 passes"
        launcher = KubernetesLauncher(
            k8s, PodTemplate(namespace="ebb", image="x"), watch_pods=False
        )
        [node] = launcher.nodes()
        assert node.cached_sources == frozenset({first, second})
    client.close()


def test_a_source_that_cannot_be_prepared_is_not_published_nor_retried(redis_url, tmp_path):
    client = redis.Redis.from_url(redis_url)
    missing = str(tmp_path / "nowhere")
    put(client, DeploymentSpec(name="gone", source=missing))
    settings = Settings(home=tmp_path / "home", redis_url=redis_url, node_name="node-b")
    tries: list[str] = []
    prefetcher = Prefetcher(settings, client, prepare=lambda s: tries.append(s) or False)
    assert prefetcher.pass_once() == [] and prefetcher.pass_once() == []
    assert tries == [missing]
    assert read_node_caches(client, now_ms=int(time.time() * 1000)) == {"node-b": frozenset()}
    client.close()
