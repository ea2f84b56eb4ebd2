"""RayLauncher on a real two-node Ray cluster on loopback, inside a network namespace of
its own (`unshare -n`, `lo` up): Ray never binds the machine's routable interfaces. The
scenario (tests/ray_two_nodes.py) runs the cluster, `ebb up` and the checks in there."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from support import REPO_ROOT

pytestmark = pytest.mark.integration


def test_runners_on_the_ray_worker_node_answer_drain_and_fail_cleanly():
    assert shutil.which("unshare") and shutil.which("ip"), "util-linux and iproute2"
    script = f"ip link set lo up && exec {sys.executable} tests/ray_two_nodes.py"
    done = subprocess.run(
        ["unshare", "-n", "--", "sh", "-c", script],
        cwd=REPO_ROOT,
        env={**__import__("os").environ, "PYTHONPATH": f"{REPO_ROOT}:{REPO_ROOT / 'tests'}"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(done.stdout[-4000:])
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
