"""The autoscaling policy and Retry-After against real arrival patterns: the Azure LLM
inference traces (bench/traces) replayed on a simulated clock by ebb.coldstart.simulation,
through the real Controller and the runner's own idle decision.

The code-completion trace is bursty (1-585 requests a minute) with idle gaps of up to
217 s; the conversation trace is steady. Runner speed and start times are the defaults of
`RunnerModel` (the default model on this 2-core machine) unless a test says otherwise.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ebb.coldstart.simulation import (
    RunnerModel,
    ScalingSettings,
    TraceRequest,
    load_azure_trace,
    simulate,
)

TRACES = Path(__file__).resolve().parents[2] / "bench" / "traces"
TICK_S = 0.05


@pytest.fixture(scope="module")
def code_trace() -> list[TraceRequest]:
    return load_azure_trace(TRACES / "azllm2023_code.csv")


def test_the_trace_loads_as_the_hour_it_is():
    half = load_azure_trace(TRACES / "azllm2023_code.csv", start_s=600, duration_s=1800)
    assert half[0].arrival_s >= 0 and half[-1].arrival_s < 1800
    whole = load_azure_trace(TRACES / "azllm2023_code.csv")
    assert len(whole) == 8819 and 3400 < whole[-1].arrival_s < 3600
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(whole, whole[1:], strict=False))


def test_every_request_is_admitted_within_the_window_or_refused(code_trace):
    settings = ScalingSettings()
    result = simulate(code_trace, settings, tick_s=TICK_S)
    assert result.admitted + result.refused == result.requests == len(code_trace)
    assert max(result.waits_s) < settings.admission_timeout_s + 2 * TICK_S
    assert min(result.retry_after_s) >= 1
    assert result.peak_replicas <= settings.max_replicas


def test_idle_gaps_scale_to_zero_and_stems_answer_the_next_request_in_time(code_trace):
    result = simulate(code_trace, ScalingSettings(idle_timeout_s=60), tick_s=TICK_S)
    # The trace has 12 gaps over 60 s; a gap must also outlast the last request's service.
    assert result.zero_periods >= 8
    # Every way back from zero starts with a pre-warmed stem (2 s), well inside the 10 s
    # window: nobody is refused for waiting on a cold start.
    assert result.starts["prewarmed"] >= result.zero_periods
    assert result.refused_while_starting == 0


def test_min_replicas_keeps_the_deployment_warm(code_trace):
    result = simulate(code_trace, ScalingSettings(min_replicas=1), tick_s=TICK_S)
    assert result.zero_periods == 0


def test_the_pool_turns_cold_start_refusals_into_admissions(code_trace):
    # Without a fork server, fresh starts slower than the admission window refuse whoever
    # waits on them alone.
    slow_fresh = RunnerModel(fresh_start_s=12.0)
    spawning = ScalingSettings(fork_server=False)
    without = simulate(code_trace, replace(spawning, prewarm=0), slow_fresh, tick_s=TICK_S)
    pooled = simulate(code_trace, spawning, slow_fresh, tick_s=TICK_S)
    assert without.refused_while_starting > 0
    assert pooled.refused_while_starting == 0
    assert pooled.refused < without.refused / 2


def test_forking_every_start_absorbs_the_bursts_the_pool_alone_cannot(code_trace):
    # Beyond the one stem, each burst's runners start fresh (10 s) without a fork server.
    settings = ScalingSettings(max_replicas=8)
    forked = simulate(code_trace, settings, tick_s=TICK_S)
    spawned = simulate(code_trace, replace(settings, fork_server=False), tick_s=TICK_S)
    assert forked.starts["forked"] > 0 and spawned.starts["fresh"] > 0
    assert forked.refused < spawned.refused / 4


@pytest.mark.parametrize(("prewarm", "fresh_start_s"), [(0, 12.0), (0, 14.0), (1, 14.0)])
def test_retry_after_never_sends_a_client_back_before_a_runner_is_ready(
    code_trace, prewarm, fresh_start_s
):
    # A short idle timeout makes the deployment fall to zero, and start again, often; fresh
    # starts (no fork server) outlast the admission window.
    settings = ScalingSettings(prewarm=prewarm, idle_timeout_s=5, fork_server=False)
    result = simulate(code_trace, settings, RunnerModel(fresh_start_s=fresh_start_s), tick_s=TICK_S)
    assert result.refused > 0
    assert result.retry_after_early == 0


def test_scaling_to_zero_costs_well_under_always_on(code_trace):
    scaled = simulate(code_trace, ScalingSettings(max_replicas=4), tick_s=TICK_S)
    always_on = simulate(code_trace, ScalingSettings(min_replicas=4, max_replicas=4), tick_s=TICK_S)
    assert always_on.zero_periods == 0
    assert scaled.runner_seconds < 0.8 * always_on.runner_seconds


def test_a_shorter_keep_alive_trades_runner_seconds_for_cold_starts(code_trace):
    # RunPod's default idle timeout against Baseten's default scale-down delay.
    short = simulate(code_trace, ScalingSettings(idle_timeout_s=5), tick_s=TICK_S)
    long = simulate(code_trace, ScalingSettings(idle_timeout_s=900), tick_s=TICK_S)
    assert short.runner_seconds < long.runner_seconds / 2
    assert short.cold_wait_fraction > 4 * long.cold_wait_fraction > 0
    assert short.zero_periods > long.zero_periods


def test_steady_traffic_with_room_never_waits_on_a_cold_start():
    trace = load_azure_trace(TRACES / "azllm2023_conv.csv", duration_s=1800)
    settings = ScalingSettings(max_replicas=16, target_concurrency=16)
    result = simulate(trace, settings, RunnerModel(decode_tokens_per_s=40.0), tick_s=TICK_S)
    assert result.refused == 0
    # Its longest gap (4.3 s) is far below the idle timeout: it never drops to zero, and
    # no runner is drained and started again (no flapping).
    assert result.zero_periods == 0 and result.flaps == 0
    assert result.wait_percentile_s(99) < settings.admission_timeout_s / 2
