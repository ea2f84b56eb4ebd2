"""`bench.step_report`: the step bench's times from what a run recorded."""

from __future__ import annotations

import json

from bench.step_report import Finished, report, scale_outs, window_p90

STEP = 1000.0


def scaled_line(at: str, direction: int) -> str:
    action = {"action": "Scaled", "policy": "slo", "desired": 2, "direction": direction}
    return json.dumps({"ts": at, "actions": [{**action, "reasons": ["p90 tpot 0.2s > 0.1s"]}]})


def finished(at_s: float, tpot_s: float) -> Finished:
    return Finished(at_s - 1, at_s, 0.1, tpot_s)


def phases(finished_requests: list[Finished]) -> dict:
    return {
        "step_at": STEP,
        "ended_at": STEP + 60,
        "tpot_target_s": 0.1,
        "base_p90_tpot_s": 0.08,
        "finished": finished_requests,
    }


def test_scale_outs_are_the_scaled_lines_going_out():
    lines = [
        "runner-x: loading",
        scaled_line("1970-01-01T00:16:45.500Z", 0),
        scaled_line("1970-01-01T00:16:50.250Z", 1),
    ]
    [out] = scale_outs(lines)
    assert out["at_s"] == 1010.25 and out["desired"] == 2


def test_the_window_needs_enough_requests_and_slides():
    done = [finished(STEP + i, 0.05 if i < 10 else 0.2) for i in range(20)]
    assert window_p90(done[:3], STEP + 3, 10) is None
    assert window_p90(done, STEP + 9, 10) == 0.05
    assert window_p90(done, STEP + 19.5, 5) == 0.2


def test_times_from_the_step_to_decision_ready_and_back_under_target():
    # Over the target with the first slow request after the step (the p90 of 8); a second
    # runner ready at 10 s; requests at 0.05 s from 12 s on bring the 5 s window back
    # under once the last slow one (at 11 s) has left it, at 16 s.
    done = [finished(STEP - 5 + i / 2, 0.08) for i in range(10)]
    done += [finished(STEP + i, 0.2) for i in range(1, 12)]
    done += [finished(STEP + 12 + i / 2, 0.05) for i in range(20)]
    lines = [scaled_line("1970-01-01T00:16:45.000Z", 1)]  # 1005.0
    changes = [(STEP - 50, 1), (STEP + 10, 2)]
    r = report(phases(done), changes, lines, window_s=5)
    assert r["p90_over_target_after_s"] == 1.0
    assert r["scale_out_decided_after_s"] == 5.0
    assert r["runner_ready_after_s"] == 10.0
    assert r["p90_back_under_target_after_s"] == 16.0
    assert r["scale_outs_before_back"] == 1
    assert (r["runners_before_step"], r["runners_at_end"]) == (1, 2)


def test_a_target_that_never_comes_back_is_said():
    done = [finished(STEP + i, 0.2) for i in range(1, 40)]
    lines = [scaled_line("1970-01-01T00:16:45.000Z", 1)]
    r = report(phases(done), [(STEP - 50, 1), (STEP + 10, 2)], lines, window_s=5)
    assert r["runner_ready_after_s"] == 10.0
    assert r["p90_back_under_target_after_s"] is None
    assert "not within the run" in r["summary"][-1]
