"""The deploy API's `scaling` block: stored as given, read back, and refused with a 400
naming the field when it cannot mean anything."""

from __future__ import annotations

import pytest
from support import deploy, deployment, wait_until

from ebb.queue import keys

SCALING = {
    "policy": "slo",
    "slo": {"ttft_p90_s": 1.0},
    "keep_alive": "learned",
    "schedule": [
        {
            "days": ["mon", "fri"],
            "from": "09:00",
            "to": "18:00",
            "tz": "Europe/Paris",
            "min_replicas": 1,
        }
    ],
}


def test_a_scaling_block_is_stored_and_patched(platform, admin):
    deploy(admin, "scaled", max_replicas=2, scaling=SCALING)
    shown = deployment(admin, "scaled")["scaling"]
    assert shown["policy"] == "slo" and shown["slo"]["ttft_p90_s"] == 1.0
    assert shown["schedule"][0]["from"] == "09:00" and shown["keep_alive"] == "learned"
    assert shown["utilisation"]["up_pct"] == 70.0
    patched = admin.patch("/v1/deployments/scaled", json={"scaling": {"policy": "utilisation"}})
    assert patched.status_code == 200, patched.text
    assert deployment(admin, "scaled")["scaling"]["policy"] == "utilisation"


@pytest.mark.parametrize(
    ("scaling", "param"),
    [
        ({"policy": "fastest"}, "scaling.policy"),
        ({"policy": "slo"}, "scaling"),
        (
            {"schedule": [{"from": "9am", "to": "18:00", "min_replicas": 1}]},
            "scaling.schedule.0.from",
        ),
        (
            {"schedule": [{"from": "09:00", "to": "24:00", "min_replicas": 1}]},
            "scaling.schedule.0.to",
        ),
        (
            {"schedule": [{"from": "٠٩:٠٠", "to": "18:00", "min_replicas": 1}]},
            "scaling.schedule.0.from",
        ),
        (
            {
                "schedule": [
                    {"from": "09:00", "to": "18:00", "tz": "Mars/Olympus", "min_replicas": 1}
                ]
            },
            "scaling.schedule.0.tz",
        ),
        (
            {
                "schedule": [
                    {"days": ["someday"], "from": "09:00", "to": "18:00", "min_replicas": 1}
                ]
            },
            "scaling.schedule.0.days.0",
        ),
        ({"schedule": [{"from": "09:00", "to": "18:00", "min_replicas": 5}]}, "scaling.schedule"),
        ({"utilisation": {"up_pct": 20, "down_pct": 30}}, "scaling.utilisation"),
    ],
)
def test_a_scaling_block_that_cannot_work_is_a_400_naming_the_field(
    platform, admin, scaling, param
):
    body = {"name": "bad-scaling", "source": "fake://m", "max_replicas": 2, "scaling": scaling}
    response = admin.post("/v1/deployments", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert "Unrecognized request argument" not in error["message"]


def ready_runner_ids(admin, name: str) -> list[str]:
    return [r["id"] for r in deployment(admin, name)["runners"] if r["state"] == "ready"]


def test_a_schedule_starts_runners_with_no_request(platform, admin):
    whole_day = {"from": "00:00", "to": "00:00", "min_replicas": 1}
    deploy(
        admin,
        "scheduled",
        source="fake://m?step_ms=0",
        max_replicas=2,
        scaling={"schedule": [whole_day]},
    )
    wait_until(lambda: len(ready_runner_ids(admin, "scheduled")) == 1, 60, "a scheduled runner")


def test_a_runner_asked_to_drain_exits_and_the_minimum_is_kept(platform, admin, platform_redis):
    deploy(admin, "drained", source="fake://m?step_ms=0", min_replicas=1, idle_timeout_s=600)
    wait_until(lambda: len(ready_runner_ids(admin, "drained")) == 1, 60, "a ready runner")
    (first,) = ready_runner_ids(admin, "drained")
    platform_redis.hset(keys.runner(first), keys.RUNNER_DRAIN_REQUESTED, "drained")
    wait_until(
        lambda: (
            first not in ready_runner_ids(admin, "drained")
            and len(ready_runner_ids(admin, "drained")) == 1
        ),
        60,
        "the runner drained and another one up for min_replicas",
    )
