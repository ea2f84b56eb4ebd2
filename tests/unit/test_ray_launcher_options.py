"""What RayLauncher asks Ray for, without a cluster (the actor class is a recording fake):
a runner its deployment's GPUs and the runners' resources; a pool's stem a sliver of the
pool's custom resource and the pool's GPUs. Where Ray then puts them is the two-node
tests' (tests/integration/test_ray_cluster.py, tests/e2e/test_ray_e2e.py)."""

from __future__ import annotations

from ebb.coldstart.launch_ray import POOL_RESOURCE_PER_STEM, RayLauncher
from ebb.coldstart.placement import Placement
from ebb.launching.stem_pools import StemPool
from ebb.launching.tiers import Tier


class _Recorded:
    def __init__(self, options: dict):
        self.options = options
        self.argv: list[str] = []
        self.wait = self

    def remote(self, *args):
        if args:
            self.argv = args[0]
        return self


class _ActorClass:
    def __init__(self) -> None:
        self.made: list[_Recorded] = []

    def options(self, **options):
        self.made.append(_Recorded(options))
        return self.made[-1]


def test_runners_ask_for_their_gpus_and_pool_stems_for_their_pools_resource(tmp_path):
    launcher = RayLauncher(
        {},
        tmp_path,
        resources_for=lambda d: {"ebb_worker": 1},
        gpus_for=lambda d: 4 if d == "tp4" else 0,
    )
    actors = _ActorClass()
    launcher._actor_class = actors
    launcher.launch_on("r-1", "tp4", Tier.FRESH, Placement())
    launcher.launch_stem("r-2", StemPool("a100", stems=2, gpus=1))
    runner, stem = actors.made
    assert runner.options["num_gpus"] == 4
    assert runner.options["resources"] == {"ebb_worker": 1}
    assert runner.argv[-2:] == ["--deployment", "tp4"]
    assert stem.options["num_gpus"] == 1
    assert stem.options["resources"] == {"a100": POOL_RESOURCE_PER_STEM}
    assert "--deployment" not in stem.argv and stem.argv[-1] == Tier.PREWARMED
    assert {runner.options["name"], stem.options["name"]} == {"r-1", "r-2"}
    assert launcher.alive("r-1") and launcher.alive("r-2")
