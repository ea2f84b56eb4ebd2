"""`bench.step_load` end to end on the fake engine (short): the 1x -> 3x step breaks the
p90 TPOT target, the controller scales out on it, and the report has every field. No
timing is asserted: the bench reports them."""

from __future__ import annotations

import json
from pathlib import Path

from bench import step_load

FIELDS = (
    "tpot_target_s",
    "base_p90_tpot_s",
    "p90_over_target_after_s",
    "scale_out_decided_after_s",
    "scale_out_reason",
    "runner_ready_after_s",
    "p90_back_under_target_after_s",
    "scale_outs_before_back",
    "timeline",
    "summary",
)


def test_a_step_to_3x_load_scales_out_on_the_tpot_target_and_is_reported():
    argv = ["--engine", "fake", "--calibrate-s", "6", "--base-s", "6", "--step-s", "15"]
    argv += ["--window-s", "5"]
    result = step_load.main(argv)
    assert all(field in result for field in FIELDS)
    assert result["runners_before_step"] == 1
    assert result["scale_out_decided_after_s"] is not None, result["summary"]
    assert "p90 tpot" in result["scale_out_reason"][0]
    assert result["runner_ready_after_s"] is not None, result["summary"]
    assert result["runners_at_end"] >= 2
    assert result["tpot_target_s"] > result["base_p90_tpot_s"]
    saved = json.loads(Path(result["path"]).read_text())
    assert saved["scale_outs"][0]["policy"] == "slo"
