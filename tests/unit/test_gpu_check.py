"""`bench/gpu_check.py` on a host without a GPU: it says so and exits cleanly, whichever
sections are asked for."""

from __future__ import annotations

import pytest

from bench import gpu_check, step_load


def test_a_host_without_gpus_is_told_and_exits_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gpu_check: no GPU on this host (")
    assert "nothing measured" in out


def test_the_issue_39_sections_are_opt_in_and_the_tiers_opt_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    default = gpu_check.parse([])
    assert (default.no_tiers, default.calibrate, default.step) == (False, False, False)
    chosen = gpu_check.parse(["--no-tiers", "--calibrate", "--step"])
    assert (chosen.no_tiers, chosen.calibrate, chosen.step) == (True, True, True)
    assert gpu_check.main(["--no-tiers", "--calibrate", "--step"]) == 0
    assert "nothing measured" in capsys.readouterr().out


def test_the_step_sections_arguments_are_the_step_bench_s() -> None:
    args = step_load.parse(gpu_check.STEP_ARGS.split())
    assert (args.engine, args.eager, args.concurrency, args.max_concurrency) == (
        "real",
        True,
        16,
        64,
    )
