"""`bench/gpu_check.py` on a host without a GPU: it says so and exits cleanly."""

from __future__ import annotations

import pytest

from bench import gpu_check


def test_a_host_without_gpus_is_told_and_exits_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gpu_check: no GPU on this host (")
    assert "nothing measured" in out
