"""The Launcher contract on the local launcher: runner processes on this machine."""

from __future__ import annotations

import pytest
from support import temp_home
from support.launcher_contract import check_launch_exit_once

from ebb.coldstart.launcher import LocalProcessLauncher
from ebb.config import Settings

pytestmark = pytest.mark.integration


def test_the_local_launcher_keeps_the_contract(redis_url):
    settings = Settings(home=temp_home("ebb-contract-"), redis_url=redis_url, fork_server=False)
    launcher = LocalProcessLauncher(settings)
    try:
        check_launch_exit_once(
            launcher,
            start=lambda _: None,
            end=lambda runner_id, _: launcher.kill(runner_id),
            code=-9,
        )
    finally:
        launcher.stop_all(grace_s=5)
