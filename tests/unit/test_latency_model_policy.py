"""The `slo` policy with the online latency model (`scaling.slo.predict`): out when the
model predicts a break at the current rate, in only when it predicts one fewer meets the
target, the measured p90 rule where it cannot judge; the prediction is in the reasons."""

from __future__ import annotations

import pytest
from support.scaling_worlds import NOW, RecordedLatencies, drains, launches, ready, reasons
from support.scaling_worlds import world as world_of

from ebb.coldstart.latency_model import LatencyFit, Line
from ebb.coldstart.plan import plan
from ebb.coldstart.scaling_inputs import Measured
from ebb.coldstart.scaling_tracker import Latency, ScalingTracker
from ebb.coldstart.world import World
from ebb.queue.scaling_spec import ScalingSpec, SloTarget
from ebb.queue.schema import DeploymentSpec

MODEL = ScalingSpec(policy="slo", slo=SloTarget(ttft_p90_s=1.0, tpot_p90_s=0.1, predict=True))
P90_ONLY = ScalingSpec(policy="slo", slo=SloTarget(ttft_p90_s=1.0, tpot_p90_s=0.1))


def fit(rate_per_s: float) -> LatencyFit:
    """TPOT 30 ms + 5 ms per request in the batch; 100 output tokens a request."""
    return LatencyFit(
        tpot=Line(0.03, 0.005, 100),
        prefill=Line(0.05, 0.0004, 100),
        tpot_mean_s=0.05,
        rate_per_s=rate_per_s,
        prompt_p90_tokens=1000,
        prompt_mean_tokens=500,
        output_mean_tokens=100,
    )


def world(scaling: ScalingSpec, ids: tuple[str, ...], measured: Measured) -> World:
    return world_of(scaling, ready(*ids), measured, max_concurrency=32)


def test_a_predicted_tpot_break_adds_a_runner_before_the_p90_shows_it() -> None:
    # 2/s on one runner: B = 2 * (0.25 + 3) / (1 - 2 * 100 * 0.005) -> beyond; 1.5/s:
    # B = 1.5 * 3.25 / 0.25 = 19.5, TPOT 0.03 + 0.005 * 19.5 = 0.1275 s > 0.1 s.
    measured = Measured(ttft_p90_s=0.3, tpot_p90_s=0.06, held={"a": 4}, latency_fit=fit(1.5))
    actions = plan(world(MODEL, ("a",), measured))
    assert launches(actions) == 1
    assert "model predicts 1 runners: batch 19.5, ttft 0.450s, tpot 0.128s: tpot > 0.1s" in (
        reasons(actions)
    )
    # The measured p90 alone would not have moved.
    assert launches(plan(world(P90_ONLY, ("a",), measured))) == 0


def test_a_rate_beyond_the_slots_adds_a_runner_and_says_the_queue_grows() -> None:
    measured = Measured(held={"a": 2}, latency_fit=fit(4.0))
    actions = plan(world(MODEL, ("a",), measured))
    assert launches(actions) == 1 and "queue grows" in reasons(actions)


def test_scale_in_when_the_model_predicts_one_fewer_meets_the_target() -> None:
    measured = Measured(
        ttft_p90_s=0.5, tpot_p90_s=0.04, held={"a": 2, "b": 0, "c": 1}, latency_fit=fit(0.2)
    )
    actions = plan(world(MODEL, ("a", "b", "c"), measured))
    assert drains(actions) == ["b"]
    assert "model predicts 2 runners: batch 0.3, ttft 0.450s, tpot 0.032s: within" in (
        reasons(actions)
    )


def test_no_scale_in_when_the_model_predicts_one_fewer_would_break_it() -> None:
    # The measured p90s are low: the measured rule drains one.
    measured = Measured(ttft_p90_s=0.2, tpot_p90_s=0.035, held={"a": 3, "b": 0, "c": 1})
    assert drains(plan(world(P90_ONLY, ("a", "b", "c"), measured))) == ["b"]
    busy = Measured(**{**measured.__dict__, "latency_fit": fit(2.5)})
    # Two runners at 2.5/s: B = 1.25 * 3.25 / 0.375 = 10.8, TPOT 0.084 s > 0.07 s.
    assert drains(plan(world(MODEL, ("a", "b", "c"), busy))) == []


def test_no_scale_in_while_the_others_would_hold_the_recent_peak_nearly_full() -> None:
    ttft_only = ScalingSpec(policy="slo", slo=SloTarget(ttft_p90_s=1.0, predict=True))
    # One runner of 32 slots would hold the peak of 24: 75 % full, over 70 %.
    measured = Measured(held={"a": 0, "b": 0}, peak_held=24, latency_fit=fit(0.01))
    assert drains(plan(world(ttft_only, ("a", "b"), measured))) == []
    calm = Measured(held={"a": 0, "b": 0}, peak_held=20, latency_fit=fit(0.01))
    assert drains(plan(world(ttft_only, ("a", "b"), calm))) == ["b"]


def test_a_ttft_over_the_target_from_prefill_alone_neither_adds_nor_keeps_runners() -> None:
    # The p90 prompt's prefill (0.05 + 0.0004 * 3000 = 1.25 s) breaks 1 s on any number
    # of runners with free slots: another runner would not shorten it.
    long_prompts = LatencyFit(**{**fit(0.2).__dict__, "prompt_p90_tokens": 3000})
    one = Measured(held={"a": 1}, latency_fit=long_prompts)
    assert launches(plan(world(MODEL, ("a",), one))) == 0
    three = Measured(held={"a": 1, "b": 0, "c": 0}, latency_fit=long_prompts)
    actions = plan(world(MODEL, ("a", "b", "c"), three))
    assert drains(actions) == ["c"]
    assert "ttft 1.250s" in reasons(actions)


def test_without_enough_samples_the_measured_p90_decides() -> None:
    broken = Measured(ttft_p90_s=1.8, held={"a": 20}, latency_fit=None)
    actions = plan(world(MODEL, ("a",), broken))
    assert launches(actions) == 1
    assert "p90 ttft 1.800s > target 1s" in reasons(actions)
    assert "model" not in reasons(actions)


def test_a_measured_break_the_model_did_not_foresee_still_adds_a_runner() -> None:
    ttft_only = ScalingSpec(policy="slo", slo=SloTarget(ttft_p90_s=1.0, predict=True))
    measured = Measured(ttft_p90_s=1.8, held={"a": 20}, latency_fit=fit(0.1))
    actions = plan(world(ttft_only, ("a",), measured))
    assert launches(actions) == 1 and "p90 ttft 1.800s" in reasons(actions)


def reported(i: int) -> Latency:
    batch, prompt = 1 + i % 8, 64 * (1 + i % 5)
    return Latency(
        "m",
        NOW + i * 0.1,
        ttft_s=0.1 + 0.001 * prompt + 0.2,
        tpot_s=0.02 + 0.01 * batch,
        prompt_tokens=prompt,
        completion_tokens=50,
        queue_s=0.2,
        batch_size=batch,
    )


@pytest.mark.parametrize("scaling", [MODEL, P90_ONLY])
async def test_the_tracker_fits_the_model_from_what_runners_report(scaling: ScalingSpec) -> None:
    unit = DeploymentSpec(name="m", source="s3://m", scaling=scaling, max_concurrency=8)
    source = RecordedLatencies()
    tracker = ScalingTracker(source)
    await tracker.measure(unit, ["a"], NOW)
    source.finished = [reported(i) for i in range(10)]
    await tracker.read_latencies(["m"])
    measured, _ = await tracker.measure(unit, ["a"], NOW + 1)
    assert measured.latency_fit is None  # 10 samples: too few
    source.finished += [reported(i) for i in range(10, 40)]
    await tracker.read_latencies(["m"])
    measured, _ = await tracker.measure(unit, ["a"], NOW + 5)
    if scaling is P90_ONLY:
        assert measured.latency_fit is None
        return
    got = measured.latency_fit
    assert got is not None and got.tpot is not None
    assert (got.tpot.intercept, got.tpot.slope) == (pytest.approx(0.02), pytest.approx(0.01))
    assert (got.prefill.intercept, got.prefill.slope) == (pytest.approx(0.1), pytest.approx(0.001))


def test_the_api_takes_slo_predict_into_the_deployments_block() -> None:
    from ebb.frontdoor.routes_scaling import ScalingBody

    body = ScalingBody.model_validate({"policy": "slo", "slo": {"ttft_p90_s": 1, "predict": True}})
    assert body.spec().slo == SloTarget(ttft_p90_s=1.0, predict=True)


def test_the_simulator_feeds_the_model_and_the_policy_logs_its_prediction(monkeypatch) -> None:
    """The real controller over simulated runners (the calibrated runner model: TPOT
    grows with the batch): the tracker fits the runner model's own constants from what
    the runners report, and the policy's scale-out gives the model's prediction."""
    import ebb.coldstart.scaling as scaling
    from ebb.coldstart.scaling_slo_model import slo_with_model
    from ebb.coldstart.simulation import ScalingSettings, TraceRequest, simulate
    from ebb.coldstart.simulation_runners import CALIBRATED

    outs: list[str] = []
    fits: list[LatencyFit] = []

    def spy(measured: Measured, *args: object, **kw: object) -> object:
        verdict = slo_with_model(measured, *args, **kw)  # type: ignore[arg-type]
        if verdict.direction > 0:
            outs.append(verdict.why)
        if measured.latency_fit is not None:
            fits.append(measured.latency_fit)
        return verdict

    monkeypatch.setattr(scaling, "slo_with_model", spy)
    # 3 requests a second, 64-112 prompt and 40 output tokens: one runner's batch of 8
    # decodes at 0.141 s a token, over the 0.12 s target.
    trace = [TraceRequest(i / 3, 64 + 16 * (i % 4), 40) for i in range(3 * 120)]
    target = SloTarget(tpot_p90_s=0.12, predict=True)
    settings = ScalingSettings(max_replicas=4, scaling=ScalingSpec(policy="slo", slo=target))
    result = simulate(trace, settings, CALIBRATED)
    assert result.peak_replicas >= 2
    tpot = fits[-1].tpot
    assert tpot is not None
    assert tpot.slope == pytest.approx(CALIBRATED.tpot_per_batch_s)
    assert tpot.at(1) == pytest.approx(CALIBRATED.tpot_s(1))
    assert fits[-1].prefill.slope == pytest.approx(1 / CALIBRATED.prefill_tokens_per_s)
    assert any(why.startswith("model predicts") for why in outs), outs[:5]
