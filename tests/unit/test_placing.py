"""A launcher behind placement: runners of a deployment go to the node that holds its
weights; stems, unknown sources and unreadable nodes go anywhere, and still launch."""

from __future__ import annotations

from ebb.coldstart.fork_client import Exit
from ebb.coldstart.placement import NodeCapacity, Placement
from ebb.coldstart.placing import PreferringLauncher
from ebb.launching.tiers import Tier

SRC = "s3://models/llama"


class FakeCluster:
    def __init__(self, nodes: list[NodeCapacity] | Exception):
        self._nodes = nodes
        self.launches: list[tuple[str, str | None, Placement]] = []

    def nodes(self) -> list[NodeCapacity]:
        if isinstance(self._nodes, Exception):
            raise self._nodes
        return self._nodes

    def launch(self, runner_id: str, deployment: str | None, tier: Tier) -> None:
        raise AssertionError("placement launches with launch_on")

    def launch_on(self, runner_id, deployment, tier, placement) -> None:
        self.launches.append((runner_id, deployment, placement))

    def poll(self) -> list[Exit]:
        return [Exit("r-1", 0)]

    def alive(self, runner_id: str) -> bool:
        return runner_id == "r-1"

    def stop_all(self, grace_s: float) -> None:
        self.stopped = grace_s


NODES = [
    NodeCapacity("roomy", free_gpus=8),
    NodeCapacity("has-llama", free_gpus=1, cached_sources=frozenset({SRC})),
]


def preferring(cluster: FakeCluster) -> PreferringLauncher:
    sources = {"llama": SRC}
    return PreferringLauncher(cluster, source_of=sources.get, gpus_for=lambda d: 1 if d else 0)


def test_a_runner_goes_to_the_node_holding_its_weights():
    cluster = FakeCluster(NODES)
    preferring(cluster).launch("r-1", "llama", Tier.FRESH)
    assert cluster.launches == [("r-1", "llama", Placement("has-llama", (0,)))]


def test_stems_unknown_sources_and_unreadable_nodes_launch_anywhere():
    cluster = FakeCluster(NODES)
    launcher = preferring(cluster)
    launcher.launch("r-stem", None, Tier.PREWARMED)
    launcher.launch("r-new", "unknown", Tier.FRESH)
    broken = FakeCluster(RuntimeError("API server down"))
    preferring(broken).launch("r-x", "llama", Tier.FRESH)
    assert [p for _, _, p in cluster.launches + broken.launches] == [Placement()] * 3


def test_the_rest_of_the_contract_is_the_inner_launchers():
    cluster = FakeCluster(NODES)
    launcher = preferring(cluster)
    assert launcher.poll() == [Exit("r-1", 0)]
    assert launcher.alive("r-1") and not launcher.alive("r-2")
    launcher.stop_all(grace_s=7)
    assert cluster.stopped == 7
