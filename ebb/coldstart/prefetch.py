"""The weight prefetcher of one node (`ebb prefetch`; a DaemonSet on Kubernetes): keeps
the node-local weight cache warm for the deployments' sources and says what it holds.

Every pass (EBB_PREFETCH_INTERVAL_S), in order:
  1. read the deployments; keep the sources whose engine prepares weights;
  2. prepare each one the cache lacks, one `ebb prepare SOURCE` process at a time (what a
     conversion costs in memory — torch for GGUF — leaves with it), never twice in this
     process's life (a cache budget too small for all would otherwise evict and fetch
     in a loop: the runner that needs an evicted one fetches it itself);
  3. publish the sources the cache holds, under this node's name (EBB_NODE_NAME), in
     Redis with an expiry of a few passes, and, with EBB_PREFETCH_ANNOTATE_NODE, as the
     node's `ebb.io/cached-sources` annotation (patched only when it changed).
Placement reads them (`placement.rank_nodes`, `placement.rank_stems`): a runner, or a stem for
it, goes first to a node that holds its weights.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from ebb.coldstart.environments import preparation_environment
from ebb.coldstart.k8s_pods import CACHED_SOURCES_ANNOTATION
from ebb.config import Settings
from ebb.engines import EngineRegistry
from ebb.queue.deployment_lookup import read_serving_units
from ebb.queue.node_caches import publish_node_cache
from ebb.weights_cache import cached_manifest

log = logging.getLogger(__name__)

# A node's published cache counts this many passes: a dead prefetcher's ages out.
_PUBLISHED_PASSES = 3


class Prefetcher:
    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        *,
        prepare: Callable[[str], bool] | None = None,
        annotate: Callable[[list[str]], None] | None = None,
    ):
        """`prepare(source)`: put the source's weights in the cache, True on success
        (default: an `ebb prepare` process); `annotate(sources)`: publish them on the
        node object (none: Redis only)."""
        self._settings = settings
        self._client = client
        self._engines = EngineRegistry.from_settings(settings)
        self._prepare = prepare or (lambda source: prepare_in_process(settings, source))
        self._annotate = annotate
        self.node = node_name(settings)
        self._tried: set[str] = set()
        self._annotated: list[str] | None = None

    def run(self, stop: threading.Event) -> None:
        log.info("prefetch: up on node %s", self.node)
        while not stop.is_set():
            try:
                self.pass_once()
            except Exception:  # Redis restarting, the API server away: next pass
                log.exception("prefetch: pass failed")
            stop.wait(self._settings.prefetch_interval_s)

    def pass_once(self) -> list[str]:
        """One pass (module docstring); the sources the cache holds after it."""
        sources = self._sources()
        for source in sources:
            if source in self._tried or self._holds(source):
                continue
            self._tried.add(source)
            log.info("prefetch: fetching %s into the node's cache", source)
            if not self._prepare(source):
                log.warning("prefetch: %s could not be prepared; runners fetch it", source)
        held = [s for s in sources if self._holds(s)]
        now_ms = int(time.time() * 1000)
        ttl_ms = int(_PUBLISHED_PASSES * self._settings.prefetch_interval_s * 1000)
        publish_node_cache(self._client, self.node, held, now_ms=now_ms, ttl_ms=ttl_ms)
        if self._annotate is not None and held != self._annotated:
            self._annotate(held)
            self._annotated = held
        return held

    def _sources(self) -> list[str]:
        wanted = set()
        # Every version's source: a new version's weights are on the node before it serves.
        for spec in read_serving_units(self._client):
            try:
                if self._engines.entry_for(spec.source).prepares_weights:
                    wanted.add(spec.source)
            except Exception:  # a source no engine serves any more: nothing to fetch
                continue
        return sorted(wanted)

    def _holds(self, source: str) -> bool:
        return cached_manifest(source, self._settings.weights_dir) is not None


def prepare_in_process(settings: Settings, source: str) -> bool:
    """`ebb prepare SOURCE` in a process of its own (what it imports leaves with it),
    with the operator's credentials only (no version's env) and no platform secret."""
    done = subprocess.run(
        [sys.executable, "-m", "ebb", "prepare", source],
        env=preparation_environment(settings, {}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if done.returncode:
        log.warning("prefetch: ebb prepare %s: %s", source, done.stderr[-2000:].decode())
    return done.returncode == 0


def node_name(settings: Settings) -> str:
    """This node's name as placement knows it: EBB_NODE_NAME (a pod's spec.nodeName),
    else the host name (what a runner on this host reports)."""
    return settings.node_name or socket.gethostname()


def node_annotator(node: str, api: Any = None) -> Callable[[list[str]], None]:
    """Patches the node's cached-sources annotation through `api` (a CoreV1Api; none:
    in-cluster credentials; RBAC: nodes patch, infra/base/prefetch.yaml)."""
    if api is None:
        from kubernetes import client, config

        config.load_incluster_config()
        api = client.CoreV1Api()

    def annotate(sources: list[str]) -> None:
        body = {"metadata": {"annotations": {CACHED_SOURCES_ANNOTATION: json.dumps(sources)}}}
        api.patch_node(node, body)

    return annotate
