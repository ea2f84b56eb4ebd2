"""The `Launcher` contract, as checks any launcher must pass; each launcher's tests supply
a way to end a runner the way its platform would (a process exit, a pod that failed)."""

from __future__ import annotations

from collections.abc import Callable

from support import wait_until

from ebb.coldstart.fork_client import Exit
from ebb.coldstart.launcher import Launcher
from ebb.launching.tiers import Tier


def collect(launcher: Launcher, runner_id: str, timeout_s: float = 10) -> list[Exit]:
    """Poll until `runner_id`'s exit shows up; every exit reported meanwhile."""
    seen: list[Exit] = []

    def reported() -> bool:
        seen.extend(launcher.poll())
        return any(e.runner_id == runner_id for e in seen)

    wait_until(reported, timeout_s, f"the exit of {runner_id}")
    return seen


def check_launch_exit_once(
    launcher: Launcher,
    *,
    start: Callable[[str], None],
    end: Callable[[str, int], None],
    code: int = 3,
) -> Exit:
    """launch → alive (once `start` made it run) → `end` → exactly one Exit, then none;
    never alive again; an id never launched is not alive."""
    launcher.launch("r-contract1", "m", Tier.FRESH)
    start("r-contract1")
    wait_until(lambda: launcher.alive("r-contract1"), 10, "the runner to run")
    assert not launcher.alive("r-never"), "an id never launched is not alive"
    assert [e for e in launcher.poll() if e.runner_id == "r-contract1"] == []
    end("r-contract1", code)
    exits = [e for e in collect(launcher, "r-contract1") if e.runner_id == "r-contract1"]
    assert len(exits) == 1, exits
    assert exits[0].code == code
    assert not launcher.alive("r-contract1")
    for _ in range(3):
        assert [e for e in launcher.poll() if e.runner_id == "r-contract1"] == []
    return exits[0]
