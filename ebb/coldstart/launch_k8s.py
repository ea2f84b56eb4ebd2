"""Runners as Kubernetes Pods, through the official `kubernetes` client (`ebb[k8s]`).

A `Launcher` and the placement contract (`placement.py`): `launch_on` creates the runner's
Pod (`k8s_pods.runner_pod`), preferring the node placement chose; `poll` reports each
runner's end exactly once — a container that exited, or a pod that will never start
(an image that cannot be pulled, no node that fits it for `unschedulable_after_s` —
a cluster-autoscaler scale-up for it, a TriggeredScaleUp event, restarts that wait —, an
OOM kill, an eviction) — with the pod's events and last log lines as the reason, and
deletes the pod. Pods are watched (list, then watch, re-listing on every reconnect).

Runners belong to the cluster: on start the launcher adopts every runner pod of its
platform (a new leader watches the old leader's runners), and `stop_all` leaves them
running unless `stop_runners_on_exit` (the next leader takes them over).

The verbs it needs, and no more (infra/base/rbac.yaml): pods create, get, list, watch,
delete; pods/log get; events list; nodes list; and get on the one PodTemplate that names
the runner image (`read_runner_image`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import watch
from kubernetes.client.rest import ApiException
from urllib3.exceptions import ReadTimeoutError

from ebb.coldstart.fork_client import Exit
from ebb.coldstart.k8s_pods import (
    CACHED_SOURCES_ANNOTATION,
    LABEL_APP,
    LABEL_PLATFORM,
    PodTemplate,
    RunnerShape,
    platform_selector,
    pod_end,
    pod_name,
    runner_id_of,
    runner_image_of,
    runner_pod,
    unschedulable,
)
from ebb.coldstart.placement import NodeCapacity, Placement
from ebb.launching.stem_pools import StemPool
from ebb.launching.tiers import Tier

log = logging.getLogger(__name__)

_LOG_TAIL_LINES = 20
_DETAIL_MAX_CHARS = 2000
SCALE_UP_REASON = "TriggeredScaleUp"  # cluster-autoscaler: a node for this pod is coming


class KubernetesLauncher:
    def __init__(
        self,
        api: Any,
        template: PodTemplate,
        *,
        gpus_for: Callable[[str | None], int] = lambda deployment: 0,
        shape_for: Callable[[str | None], RunnerShape] | None = None,
        unschedulable_after_s: float = 900.0,
        stop_runners_on_exit: bool = False,
        watch_pods: bool = True,
        watch_timeout_s: float = 60.0,
    ):
        """`api`: a `kubernetes.client.CoreV1Api`; `shape_for(deployment)`: what a runner
        of it asks of its node (a stem: None), else only `gpus_for(deployment)` GPUs."""
        self._api = api
        self._t = template
        self._shape_for = shape_for or (lambda deployment: RunnerShape(gpus=gpus_for(deployment)))
        self._unschedulable_after_s = unschedulable_after_s
        self._stop_on_exit = stop_runners_on_exit
        self._lock = threading.Lock()
        self._pods: dict[str, dict[str, Any]] = {}  # runner id -> last seen pod
        self._mine: set[str] = set()  # launched or adopted, end not reported yet
        self._stuck_since: dict[str, float] = {}  # runner id -> unschedulable since
        self._scale_ups: dict[str, set[tuple[str, int]]] = {}  # runner id -> events seen
        self._exits: list[Exit] = []
        self._closing = threading.Event()
        self._watch_timeout_s = watch_timeout_s
        self._stream: Any = None
        self.refresh()
        self._mine |= set(self._pods)  # adopt the runners of an earlier controller
        self._watcher: threading.Thread | None = None
        if watch_pods:
            self._watcher = threading.Thread(target=self._watch, name="k8s-pods", daemon=True)
            self._watcher.start()

    # --- Launcher ------------------------------------------------------------------------

    def launch(self, runner_id: str, deployment: str | None, tier: Tier) -> None:
        self.launch_on(runner_id, deployment, tier, Placement())

    def launch_on(
        self, runner_id: str, deployment: str | None, tier: Tier, placement: Placement
    ) -> None:
        pod = runner_pod(
            self._t,
            runner_id,
            deployment,
            tier,
            shape=self._shape_for(deployment),
            placement=placement,
        )
        self._create(runner_id, pod, f"{deployment or ''!r} ({tier})", placement.node or "any node")

    def _create(self, runner_id: str, pod: dict[str, Any], what: str, where: str) -> None:
        with self._lock:
            self._mine.add(runner_id)
        try:
            created = self._api.create_namespaced_pod(self._t.namespace, pod)
        except ApiException as e:
            with self._lock:
                self._mine.discard(runner_id)
                self._exits.append(Exit(runner_id, -1, f"the pod was refused: {_api_error(e)}"))
            return
        self._see(self._api.api_client.sanitize_for_serialization(created))
        log.info("coldstart: pod %s for %s on %s", pod_name(runner_id), what, where)

    def launch_stem(self, runner_id: str, pool: StemPool) -> None:
        """A stem pod on a node of `pool` (nodeSelector on the pool label), requesting the
        pool's GPUs: a pod's devices are fixed at creation, so it holds them waiting."""
        pod = runner_pod(
            self._t,
            runner_id,
            None,
            Tier.PREWARMED,
            shape=RunnerShape(gpus=pool.gpus),
            placement=Placement(),
            pool=pool.name,
        )
        self._create(runner_id, pod, f"stem of pool {pool.name!r}", "its pool's nodes")

    def poll(self) -> list[Exit]:
        if self._watcher is None:
            self.refresh()
        ended: list[tuple[str, str, int, bool]] = []
        with self._lock:
            for runner_id in list(self._mine):
                pod = self._pods.get(runner_id)
                end = self._end_of(runner_id, pod)
                if end is not None:
                    ended.append((runner_id, *end))
            exits, self._exits = self._exits, []
        for runner_id, reason, code, unplaced in ended:
            if unplaced and self._scaling_up(runner_id):
                continue
            with self._lock:
                self._mine.discard(runner_id)
                self._stuck_since.pop(runner_id, None)
                self._scale_ups.pop(runner_id, None)
            exits.append(Exit(runner_id, code, self._detail(runner_id, reason)))
            self._delete(runner_id, grace_s=0)
        return exits

    def _scaling_up(self, runner_id: str) -> bool:
        """Whether the cluster autoscaler started a node for this pod since we last
        looked (a TriggeredScaleUp event not seen before): then its wait starts over."""
        try:
            events = self._events(pod_name(runner_id))
        except ApiException as e:
            log.warning("coldstart: events of %s unreadable: %s", runner_id, _api_error(e))
            return False
        fresh = {
            (str((e.get("metadata") or {}).get("name", "")), int(e.get("count") or 1))
            for e in events
            if e.get("reason") == SCALE_UP_REASON
        }
        with self._lock:
            seen = self._scale_ups.setdefault(runner_id, set())
            if not fresh - seen:
                return False
            seen |= fresh
            self._stuck_since[runner_id] = time.monotonic()
        log.info("coldstart: pod of %s waits for a node the autoscaler adds", runner_id)
        return True

    def _events(self, name: str) -> list[dict[str, Any]]:
        """The events of one pod (checked here too: a field selector may be ignored)."""
        raw = _json(
            self._api.list_namespaced_event(
                self._t.namespace,
                field_selector=f"involvedObject.name={name}",
                _preload_content=False,
            )
        )
        return [
            e for e in raw.get("items", []) if (e.get("involvedObject") or {}).get("name") == name
        ]

    def alive(self, runner_id: str) -> bool:
        with self._lock:
            pod = self._pods.get(runner_id)
            return runner_id in self._mine and pod is not None and pod_end(pod) is None

    def stop(self, runner_id: str, grace_s: float) -> None:
        """Ask one runner to drain (SIGTERM), killed after `grace_s`."""
        self._delete(runner_id, grace_s=grace_s)

    def stop_all(self, grace_s: float) -> None:
        self.close()
        if not self._stop_on_exit:
            log.info("coldstart: leaving %d runner pods to the next leader", len(self._mine))
            return
        for runner_id in list(self._mine):
            self._delete(runner_id, grace_s=grace_s)

    def close(self) -> None:
        """Stop watching (within a watch timeout); the pods are left as they are."""
        self._closing.set()
        if self._stream is not None:
            self._stream.stop()
        if self._watcher is not None:
            self._watcher.join(timeout=self._watch_timeout_s + 5)

    # --- placement -----------------------------------------------------------------------

    def nodes(self) -> list[NodeCapacity]:
        """Every node as placement sees it: GPUs allocatable less those runner pods
        request there, the sources its cache holds (its prefetcher's annotation)."""
        raw = _json(self._api.list_node(_preload_content=False))
        with self._lock:
            pods = list(self._pods.values())
        used: dict[str, int] = {}
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node and pod_end(pod) is None:
                used[node] = used.get(node, 0) + _gpus_requested(pod, self._t.gpu_resource)
        return [self._node(n, used) for n in raw.get("items", [])]

    def _node(self, node: dict[str, Any], used: dict[str, int]) -> NodeCapacity:
        meta, status = node.get("metadata") or {}, node.get("status") or {}
        name = meta.get("name", "")
        allocatable = int((status.get("allocatable") or {}).get(self._t.gpu_resource, 0))
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        cached = json.loads((meta.get("annotations") or {}).get(CACHED_SOURCES_ANNOTATION, "[]"))
        return NodeCapacity(
            name=name,
            free_gpus=max(0, allocatable - used.get(name, 0)),
            cached_sources=frozenset(cached),
            schedulable=ready and not (node.get("spec") or {}).get("unschedulable", False),
        )

    # --- the pod cache -------------------------------------------------------------------

    def refresh(self) -> None:
        """List the platform's runner pods now (the watch keeps them current after)."""
        raw = _json(
            self._api.list_namespaced_pod(
                self._t.namespace, label_selector=platform_selector(self._t), _preload_content=False
            )
        )
        pods = {rid: p for p in raw.get("items", []) if (rid := self._runner_of(p))}
        with self._lock:
            gone = set(self._pods) - set(pods)
            self._pods = pods
            for runner_id in gone:
                self._stuck_since.pop(runner_id, None)
                self._scale_ups.pop(runner_id, None)

    def _watch(self) -> None:
        while not self._closing.is_set():
            self._stream = watch.Watch()
            try:
                self.refresh()
                # The read timeout ends a watch whose connection died silently (and lets
                # `close` return); the server ends it at timeout_seconds otherwise.
                for event in self._stream.stream(
                    self._api.list_namespaced_pod,
                    self._t.namespace,
                    label_selector=platform_selector(self._t),
                    timeout_seconds=int(self._watch_timeout_s),
                    _request_timeout=(5, self._watch_timeout_s + 1),
                ):
                    self._on_event(event["type"], event["raw_object"])
            except ReadTimeoutError:
                pass
            except Exception:  # an API server restart: list again, then watch again
                log.exception("coldstart: watching runner pods failed; re-listing")
                self._closing.wait(1.0)

    def _on_event(self, kind: str, pod: dict[str, Any]) -> None:
        runner_id = self._runner_of(pod)
        if runner_id is None:
            return
        if kind == "DELETED":
            with self._lock:
                self._pods.pop(runner_id, None)
        else:
            self._see(pod)

    def _see(self, pod: dict[str, Any]) -> None:
        runner_id = self._runner_of(pod)
        if runner_id is not None:
            with self._lock:
                self._pods[runner_id] = pod

    def _runner_of(self, pod: dict[str, Any]) -> str | None:
        """The runner id of one of this platform's runner pods (checked here as well: a
        selector the server ignored must not hand us another platform's pods)."""
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if platform_selector(self._t) != ",".join(
            f"{k}={labels.get(k)}" for k in (LABEL_APP, LABEL_PLATFORM)
        ):
            return None
        return runner_id_of(pod)

    def _end_of(self, runner_id: str, pod: dict[str, Any] | None) -> tuple[str, int, bool] | None:
        """(reason, code, unschedulable) if the runner's pod is over, or has waited for a
        node longer than it may; called with the lock held."""
        if pod is None:
            return "the pod was deleted", -1, False
        end = pod_end(pod)
        if end is not None:
            return end.reason, end.code, False
        stuck = unschedulable(pod)
        if stuck is None:
            self._stuck_since.pop(runner_id, None)
            return None
        since = self._stuck_since.setdefault(runner_id, time.monotonic())
        if time.monotonic() - since >= self._unschedulable_after_s:
            return stuck, -1, True
        return None

    def _detail(self, runner_id: str, reason: str) -> str:
        """The reason, the pod's events and its last log lines: what an operator reads."""
        name = pod_name(runner_id)
        lines = [f"pod {name}: {reason}"]
        try:
            for e in self._events(name):
                lines.append(f"event {e.get('reason', '')}: {e.get('message', '')}")
        except ApiException as e:
            lines.append(f"(events unavailable: {_api_error(e)})")
        try:
            tail = self._api.read_namespaced_pod_log(
                name, self._t.namespace, tail_lines=_LOG_TAIL_LINES, _preload_content=False
            ).data.decode(errors="replace")
            lines += [f"log: {line}" for line in tail.splitlines()[-_LOG_TAIL_LINES:]]
        except ApiException:
            pass  # never ran: no log to show
        return "\n".join(lines)[:_DETAIL_MAX_CHARS]

    def _delete(self, runner_id: str, grace_s: float) -> None:
        try:
            self._api.delete_namespaced_pod(
                pod_name(runner_id), self._t.namespace, grace_period_seconds=int(grace_s)
            )
        except ApiException as e:
            if e.status != 404:
                log.warning("coldstart: deleting pod of %s failed: %s", runner_id, _api_error(e))


def read_runner_image(api: Any, namespace: str, template_name: str) -> str:
    """The runner image the cluster's PodTemplate `template_name` names (k8s_pods)."""
    raw = api.read_namespaced_pod_template(template_name, namespace, _preload_content=False)
    return runner_image_of(_json(raw))


def _json(response: Any) -> dict[str, Any]:
    data = json.loads(response.data)
    return data if isinstance(data, dict) else {}


def _api_error(e: ApiException) -> str:
    try:
        message = json.loads(e.body).get("message", "")
    except (TypeError, ValueError):
        message = e.body or ""
    return f"{e.status} {e.reason}: {message}".rstrip(": ")


def _gpus_requested(pod: dict[str, Any], resource: str) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        total += int(((c.get("resources") or {}).get("requests") or {}).get(resource, 0))
    return total
