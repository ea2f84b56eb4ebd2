"""The autoscaling policy is a pure function: snapshots in, desired replicas out."""

from __future__ import annotations

from ebb.coldstart.policy import DemandSnapshot, PolicyConfig, desired_replicas

CONFIG = PolicyConfig(scale_up_after_s=2.0)


def snap(**fields) -> DemandSnapshot:
    base = dict(
        queue_depth=0,
        oldest_wait_s=0.0,
        starting=0,
        ready=0,
        min_replicas=0,
        max_replicas=4,
        target_concurrency=8,
    )
    return DemandSnapshot(**{**base, **fields})


def test_zero_to_one_on_the_first_request_without_waiting():
    assert desired_replicas(snap(queue_depth=1, oldest_wait_s=0.0), CONFIG) == 1


def test_cold_start_sizes_for_the_whole_queue_within_bounds():
    assert desired_replicas(snap(queue_depth=20), CONFIG) == 3
    assert desired_replicas(snap(queue_depth=500), CONFIG) == 4


def test_idle_deployment_stays_at_min():
    assert desired_replicas(snap(), CONFIG) == 0
    assert desired_replicas(snap(min_replicas=2), CONFIG) == 2


def test_never_scales_down_a_runner_that_holds_work_or_is_loading():
    # Scale-down happens only by idle drain inside the runner: the policy keeps what runs.
    assert desired_replicas(snap(ready=3), CONFIG) == 3
    assert desired_replicas(snap(starting=2), CONFIG) == 2


def test_scale_up_only_after_sustained_queueing():
    assert desired_replicas(snap(ready=1, queue_depth=5, oldest_wait_s=0.5), CONFIG) == 1
    assert desired_replicas(snap(ready=1, queue_depth=5, oldest_wait_s=2.5), CONFIG) == 2


def test_sustained_queueing_adds_runners_for_the_whole_queue():
    # 20 queued at 8 per runner: three more runners at once, not one per episode.
    at = snap(ready=1, queue_depth=20, oldest_wait_s=3.0, max_replicas=10)
    assert desired_replicas(at, CONFIG) == 4


def test_no_flapping_while_a_new_runner_is_on_its_way():
    # Queueing persists while the added runner loads: wait for it instead of adding more.
    at = snap(ready=1, starting=1, queue_depth=40, oldest_wait_s=10.0)
    assert desired_replicas(at, CONFIG) == 2


def test_a_fake_clock_run_scales_once_per_sustained_episode():
    """Replay a queue that stays at 10 with runners busy, on a fake clock."""
    replicas, starting = 1, 0
    decisions = []
    for second in range(10):
        desired = desired_replicas(
            snap(ready=replicas, starting=starting, queue_depth=10, oldest_wait_s=float(second)),
            CONFIG,
        )
        if desired > replicas + starting:
            starting += desired - replicas - starting
        if second == 5 and starting:  # the new runners became ready
            replicas, starting = replicas + starting, 0
        decisions.append(replicas + starting)
    # +2 (10 queued at 8 each) after 2 s, nothing more while they load, then the bound.
    assert decisions == [1, 1, 3, 3, 3, 3, 4, 4, 4, 4]


def test_bounds_are_respected():
    assert desired_replicas(snap(ready=4, queue_depth=99, oldest_wait_s=60), CONFIG) == 4
    assert desired_replicas(snap(max_replicas=1, queue_depth=99), CONFIG) == 1
