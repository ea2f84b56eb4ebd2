"""Placement preference: nodes that hold the weights first, then warm ones, then free GPUs;
nodes that cannot take the runner never."""

from __future__ import annotations

from ebb.coldstart.placement import (
    NodeCapacity,
    Placement,
    choose_placement,
    overall_warm_state,
    rank_nodes,
)
from ebb.launching.tiers import WarmState

SRC = "s3://models/llama"


def names(nodes: list[NodeCapacity]) -> list[str]:
    return [n.name for n in nodes]


def test_a_node_holding_the_weights_beats_warmer_and_emptier_ones():
    nodes = [
        NodeCapacity("empty", free_gpus=8, warm=WarmState.READY, stems=2),
        NodeCapacity("cached", free_gpus=1, cached_sources=frozenset({SRC})),
    ]
    assert names(rank_nodes(nodes, SRC, gpus=1)) == ["cached", "empty"]
    assert choose_placement(nodes, SRC, gpus=1) == Placement("cached", (0,))


def test_without_the_weights_anywhere_warm_capacity_then_free_gpus_decide():
    nodes = [
        NodeCapacity("b-roomy", free_gpus=4),
        NodeCapacity("a-roomy", free_gpus=4),
        NodeCapacity("stems", free_gpus=1, stems=1),
        NodeCapacity("forks", free_gpus=1, warm=WarmState.READY),
        NodeCapacity("tiny", free_gpus=2),
    ]
    assert names(rank_nodes(nodes, SRC, gpus=1)) == ["forks", "stems", "a-roomy", "b-roomy", "tiny"]


def test_nodes_that_cannot_take_the_runner_are_never_chosen():
    nodes = [
        NodeCapacity("cached-but-full", free_gpus=1, cached_sources=frozenset({SRC})),
        NodeCapacity("cordoned", free_gpus=8, schedulable=False),
        NodeCapacity("fits", free_gpus=2),
    ]
    assert names(rank_nodes(nodes, SRC, gpus=2)) == ["fits"]
    assert choose_placement(nodes, SRC, gpus=2) == Placement("fits", (0, 1))
    assert choose_placement(nodes, SRC, gpus=9) is None, "left to the scheduler to queue"


def test_a_cpu_runner_fits_any_schedulable_node():
    nodes = [NodeCapacity("cpu"), NodeCapacity("off", schedulable=False)]
    assert choose_placement(nodes, SRC, gpus=0) == Placement("cpu", ())


def test_the_controller_sees_the_best_warm_state_of_the_schedulable_nodes():
    def of(*states: WarmState, cordoned: WarmState | None = None) -> WarmState:
        nodes = [NodeCapacity(f"n{i}", warm=s) for i, s in enumerate(states)]
        if cordoned is not None:
            nodes.append(NodeCapacity("c", warm=cordoned, schedulable=False))
        return overall_warm_state(nodes)

    assert of(WarmState.DOWN, WarmState.READY, WarmState.STARTING) is WarmState.READY
    assert of(WarmState.DOWN, WarmState.STARTING) is WarmState.STARTING
    assert of(WarmState.OFF, WarmState.DOWN) is WarmState.DOWN
    assert of(WarmState.OFF, cordoned=WarmState.READY) is WarmState.OFF
    assert of() is WarmState.OFF
