"""A `bench.latency_calibrate` result file in, the simulator's runner model out
(`bench.autoscale --runner-file`, `simulation_runners.from_calibration`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.autoscale import runner_model, tpot_target_s
from bench.latency_calibrate import calibration
from ebb.coldstart.simulation_runners import CALIBRATED, RunnerModel

# The fitted constants of the CPU run `CALIBRATED` was pasted from, as the file has them.
CPU_RUN = {
    "prefill_base_s": -0.09,
    "prefill_per_token_s": 0.0047141,
    "tpot_base_s": 0.0776,
    "tpot_per_batch_s": 0.00799,
}


def write(tmp_path: Path, payload: dict) -> Path:
    path = tmp_path / "latency-calibrate-x.json"
    path.write_text(json.dumps(payload))
    return path


def test_the_cpu_runs_file_gives_the_calibrated_runner_model(tmp_path: Path) -> None:
    path = write(tmp_path, {"constants": CPU_RUN, "device": "cpu: x86_64, 2 cores"})
    model, source = runner_model("default", path)
    assert model == CALIBRATED
    assert "cpu: x86_64, 2 cores" in source
    assert "RunnerModel's defaults" in source  # no start times measured: said so
    assert tpot_target_s(model) == 0.12


def test_start_times_the_run_measured_replace_the_defaults(tmp_path: Path) -> None:
    starts = {"engine_import_s": 6.0, "engine_load_s": 1.5}
    path = write(tmp_path, {"constants": CPU_RUN, "starts": starts, "device": "cuda: H100"})
    model, source = runner_model("default", path)
    assert (model.prewarmed_start_s, model.forked_start_s) == (1.5, 1.5)
    assert (model.fresh_start_s, model.stem_import_s) == (7.5, 6.0)
    assert model.tpot_per_batch_s == CALIBRATED.tpot_per_batch_s
    assert "measured by the calibrate run" in source and "cuda: H100" in source


def test_what_calibrate_writes_is_what_the_runner_model_needs(tmp_path: Path) -> None:
    # A GPU-like engine: 20 ms + 0.1 ms per prompt token to the first token, and
    # 4 ms + 0.5 ms per request in the batch per output token.
    prefill = [(n, 0.02 + 0.0001 * n) for n in (16, 128, 512)]
    decode = [(b, 0.004 + 0.0005 * b) for b in (1, 4, 16, 64)]
    result = calibration(prefill, decode, {"engine_import_s": 5.0, "engine_load_s": 9.0}, "gpu")
    model, _ = runner_model("default", write(tmp_path, result))
    assert model.prefill_s(1000) == pytest.approx(0.02 + 0.1, rel=1e-3)
    for batch in (1, 8, 32):
        assert model.tpot_s(batch) == pytest.approx(0.004 + 0.0005 * batch, rel=1e-3)
    assert model.fresh_start_s == 14.0
    assert tpot_target_s(model) == 0.0065


def test_a_file_without_a_positive_speed_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, {"constants": {**CPU_RUN, "prefill_per_token_s": 0.0}})
    with pytest.raises(ValueError, match="no positive speed"):
        runner_model("default", path)


def test_without_a_file_the_named_runner_model(tmp_path: Path) -> None:
    assert runner_model("calibrated", None)[0] == CALIBRATED
    assert runner_model("default", None)[0] == RunnerModel()
