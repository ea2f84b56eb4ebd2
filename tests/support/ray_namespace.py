"""Running tests/support/ray_two_nodes.py inside a network namespace of its own (`unshare
-n`, only `lo`, up), so that Ray binds nothing but 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from support import REPO_ROOT


def run_in_namespace(*args: str) -> None:
    """tests/support/ray_two_nodes.py in a new network namespace with only `lo`, up."""
    assert shutil.which("unshare") and shutil.which("ip"), "util-linux and iproute2"
    script = f"ip link set lo up && exec {sys.executable} -m support.ray_two_nodes {' '.join(args)}"
    done = subprocess.run(
        ["unshare", "-n", "--", "sh", "-c", script],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": f"{REPO_ROOT}:{REPO_ROOT / 'tests'}"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(done.stdout[-4000:])
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
