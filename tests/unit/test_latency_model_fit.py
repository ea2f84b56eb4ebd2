"""The online latency model (`coldstart.latency_model`): it recovers known constants from
synthetic samples, refuses to predict with too few or with no spread, and predicts what a
number of runners would show at a rate (Little's law)."""

from __future__ import annotations

import math
import random

import pytest

from ebb.coldstart.latency_model import (
    MIN_SAMPLES,
    RATE_WINDOW_S,
    LatencyFit,
    LatencyModel,
    Line,
    Sample,
    fit_line,
    predict,
)

NOW = 1_800_000_000.0
# TPOT = A + B * batch; TTFT = C + D * prompt tokens + queue wait.
A, B, C, D = 0.030, 0.004, 0.050, 0.0004


def synthetic(n: int, *, noise: float = 0.0, seed: int = 1) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        batch, prompt, queue_s = rng.randint(1, 16), rng.randint(16, 1024), rng.uniform(0, 2)
        jitter = 1 + rng.uniform(-noise, noise)
        out.append(
            Sample(
                finished_s=NOW - n + i,
                prompt_tokens=prompt,
                completion_tokens=100,
                ttft_s=(C + D * prompt) * jitter + queue_s,
                queue_s=queue_s,
                tpot_s=(A + B * batch) * jitter,
                batch_size=batch,
            )
        )
    return out


def test_the_fit_recovers_known_constants_from_synthetic_samples() -> None:
    model = LatencyModel()
    model.observe(synthetic(200, noise=0.05))
    fit = model.fit(NOW)
    assert fit is not None and fit.tpot is not None
    assert fit.tpot.intercept == pytest.approx(A, rel=0.1)
    assert fit.tpot.slope == pytest.approx(B, rel=0.1)
    assert fit.prefill.intercept == pytest.approx(C, rel=0.25)
    assert fit.prefill.slope == pytest.approx(D, rel=0.1)
    assert fit.rate_per_s == pytest.approx(RATE_WINDOW_S / RATE_WINDOW_S)  # one a second


def test_the_fit_is_exact_on_exact_samples() -> None:
    line = fit_line([(x, 2.0 + 0.5 * x) for x in range(30)])
    assert line == Line(pytest.approx(2.0), pytest.approx(0.5), 30)  # type: ignore[arg-type]


def test_it_refuses_to_predict_with_too_few_samples() -> None:
    model = LatencyModel()
    model.observe(synthetic(MIN_SAMPLES - 1))
    assert model.fit(NOW) is None
    model.observe(synthetic(1, seed=2))
    assert model.fit(NOW) is not None


def test_a_tpot_line_needs_more_than_one_batch_size() -> None:
    one_batch = [
        Sample(NOW, 16 * (1 + i), 10, 0.2, 0.0, tpot_s=0.05, batch_size=8)
        for i in range(MIN_SAMPLES)
    ]
    model = LatencyModel()
    model.observe(one_batch)
    fit = model.fit(NOW)
    assert fit is not None and fit.prefill is not None
    assert fit.tpot is None  # nothing says how TPOT grows with the batch
    assert predict(fit, runners=1, slots=8).tpot_s is None


def test_a_falling_slope_is_taken_as_flat() -> None:
    line = fit_line([(x, 1.0 - 0.01 * x) for x in range(30)])
    assert line is not None and line.slope == 0.0
    assert line.intercept == pytest.approx(1.0 - 0.01 * 14.5)


def test_the_window_forgets_old_samples() -> None:
    model = LatencyModel(kept=50, min_samples=20)
    slow = [
        Sample(NOW, 100, 10, 1.0, 0.0, tpot_s=0.5 + 0.1 * (i % 4), batch_size=1 + i % 4)
        for i in range(50)
    ]
    model.observe(slow)
    model.observe(synthetic(50))
    fit = model.fit(NOW)
    assert fit is not None and fit.tpot is not None
    assert fit.tpot.slope == pytest.approx(B)


FIT = LatencyFit(
    tpot=Line(A, B, 100),
    prefill=Line(C, D, 100),
    tpot_mean_s=A,
    rate_per_s=1.0,
    prompt_p90_tokens=1000,
    prompt_mean_tokens=500,
    output_mean_tokens=100,
)


def test_prediction_follows_littles_law() -> None:
    p = predict(FIT, runners=2, slots=32)
    # B = (0.5/s)(0.25 + 100 * 0.03) / (1 - 0.5 * 100 * 0.004) = 1.625 / 0.8
    assert p.batch == pytest.approx(2.03125)
    assert p.tpot_s == pytest.approx(A + B * 2.03125)
    assert p.ttft_s == pytest.approx(C + D * 1000)


def test_prediction_takes_the_batch_held_now_when_it_is_more() -> None:
    p = predict(FIT, runners=2, slots=32, held=20)
    assert p.batch == 10 and p.tpot_s == pytest.approx(A + B * 10)


def test_a_rate_beyond_the_slots_predicts_a_growing_queue() -> None:
    busy = LatencyFit(**{**FIT.__dict__, "rate_per_s": 6.0})
    p = predict(busy, runners=2, slots=32)
    assert math.isinf(p.batch) and math.isinf(p.ttft_s)
    assert "queue grows" in p.describe()
