"""Each plan's actions are logged per deployment with the figures that led to them, in a
file of that deployment's uid that `ebb logs DEPLOYMENT` reads; nothing of another
deployment reaches it."""

from __future__ import annotations

import json
import time

from ebb.coldstart.decision_log import DecisionLog
from ebb.coldstart.placement import GIB
from ebb.coldstart.plan import AssignStem, DropStem, Launch, MarkUnschedulable, plan
from ebb.coldstart.world import Demand, Gpus, World
from ebb.launching.stem_pools import StemPool
from ebb.launching.tiers import Tier
from ebb.logtail import decisions_log, decode_cursor, encode_cursor, read_new
from ebb.queue.gpu_records import GpuDevice, HostInventory
from ebb.queue.schema import DeploymentSpec, RunnerRecord, RunnerState

MINE = DeploymentSpec(name="mine", source="fake://a", uid="dep_mine", max_concurrency=4)
THEIRS = DeploymentSpec(name="theirs", source="fake://b", uid="dep_theirs")
GPU = GpuDevice(index=0, uuid="GPU-0", name="L4", total_bytes=24 * GIB, free_bytes=20 * GIB)


def test_each_deployments_decisions_go_to_its_own_file_with_its_figures(tmp_path):
    world = World(
        demands=(
            Demand(spec=MINE, queue_depth=5, oldest_wait_s=1.25, ready=1),
            Demand(spec=THEIRS, queue_depth=7, job_depth=2),
        ),
        runners=(RunnerRecord(runner_id="r-stem", state=RunnerState.PREWARMED),),
        gpus=Gpus(inventories=(HostInventory(host="h1", devices=[GPU]),)),
    )
    actions = [
        AssignStem("r-stem", "mine", "dep_mine"),
        Launch(Tier.FRESH, "theirs", "dep_theirs"),
        MarkUnschedulable("theirs", "needs 30.0 GiB"),
        DropStem("r-dead"),
        Launch(Tier.PREWARMED, pool=StemPool("", 1)),
    ]
    DecisionLog(tmp_path).record(world, actions)
    mine_path = decisions_log(tmp_path, "dep_mine")
    assert mine_path is not None
    [line] = mine_path.read_text().splitlines()
    decided = json.loads(line)
    assert decided["deployment"] == "mine"
    assert decided["actions"] == [
        {"action": "AssignStem", "stem": "r-stem", "deployment": "mine", "uid": "dep_mine"}
    ]
    assert decided["queue"] == {"requests": 5, "jobs": 0, "oldest_wait_s": 1.25}
    assert decided["runners"]["ready"] == 1 and decided["runners"]["max_concurrency"] == 4
    assert decided["gpu_free_bytes"] == {"h1:0": 20 * GIB} and decided["stems_waiting"] == 1
    assert "theirs" not in line and "r-dead" not in line
    theirs = decisions_log(tmp_path, "dep_theirs").read_text()  # type: ignore[union-attr]
    assert [a["action"] for a in json.loads(theirs)["actions"]] == ["Launch", "MarkUnschedulable"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "decisions-dep_mine.log",
        "decisions-dep_theirs.log",
    ]
    # `ebb logs --since` reads each line's time.
    lines, _ = read_new([mine_path], None, since_s=time.time() - 60)
    assert [x.text for x in lines] == [line]


def test_an_empty_plan_logs_nothing_and_a_uid_that_names_no_file_writes_none(tmp_path):
    DecisionLog(tmp_path).record(World(demands=(Demand(spec=MINE),), pools={}), [])
    odd = DeploymentSpec(name="old", source="fake://a", uid="")
    world = World(demands=(Demand(spec=odd, queue_depth=1),), pools={})
    DecisionLog(tmp_path).record(world, plan(world))
    assert list(tmp_path.iterdir()) == []
    assert decisions_log(tmp_path, "../etc") is None


def test_a_follower_cursor_may_name_a_decisions_file():
    offsets = {"decisions-dep_mine.log": 3, "runner-r-1.log": 5}
    assert decode_cursor(encode_cursor(offsets)) == offsets
