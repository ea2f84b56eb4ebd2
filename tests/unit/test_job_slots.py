"""How many batch slots async jobs may hold beside synchronous traffic."""

from __future__ import annotations

from ebb.runners.serve import job_claims_per_step, job_slots, jobs_beside_sync


def test_a_quarter_of_the_slots_stays_free_for_synchronous_requests():
    assert [job_slots(n) for n in (1, 2, 4, 32)] == [1, 1, 3, 24]


def test_unset_no_job_beside_a_synchronous_request_on_cpus_three_quarters_on_gpus():
    assert jobs_beside_sync(None, gpus=0) == 0
    assert jobs_beside_sync(None, gpus=1) is None  # job_slots


def test_a_configured_figure_holds_on_any_device():
    assert jobs_beside_sync(5, gpus=0) == 5
    assert jobs_beside_sync(0, gpus=8) == 0


def test_an_eighth_of_the_slots_is_claimed_for_jobs_per_step():
    assert [job_claims_per_step(n) for n in (1, 4, 8, 9, 32, 256)] == [1, 1, 1, 2, 4, 32]
