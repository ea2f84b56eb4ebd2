"""RayLauncher on a real two-node Ray cluster on loopback, inside a network namespace of
its own (`unshare -n`, `lo` up): Ray never binds the machine's routable interfaces. The
scenario (tests/support/ray_two_nodes.py) runs the cluster, `ebb up` and the checks in there."""

from __future__ import annotations

import pytest
from support.ray_namespace import run_in_namespace

pytestmark = pytest.mark.integration


def test_runners_on_the_ray_worker_node_answer_drain_and_fail_cleanly():
    run_in_namespace()
