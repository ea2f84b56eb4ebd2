"""VllmEngine on the default model (SmolLM2-135M-Instruct), through the EngineAdapter seam.

One engine serves the whole module (loading costs ~10 s on 2 cores); every test leaves it
with nothing running.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict

import pytest

from ebb.queue.schema import ChoiceDelta, SamplingSpec
from ebb.runners.engine import EngineOptions, EngineRequestError, StepOutput

pytestmark = pytest.mark.e2e

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def engine(default_local_model):
    from ebb.runners.engine_vllm import VllmEngine

    options = EngineOptions(
        model_path=default_local_model.path,
        max_model_len=min(default_local_model.max_model_len, 2048),
        max_num_seqs=8,
        kv_cache_gib=1,
    )
    engine = VllmEngine.load(options)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def prompt_ids(default_local_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_local_model.path)

    def build(question: str) -> list[int]:
        messages = [{"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    return build


@pytest.fixture(autouse=True)
def _engine_left_idle(engine):
    yield
    assert not engine.has_unfinished()


def drain(engine, timeout_s: float = 60.0) -> dict[str, list[StepOutput]]:
    """Step until the engine is idle; each request's outputs, in order.

    Bounded by time, not steps: while a structured-output grammar compiles, steps return
    nothing, and how many of them that takes depends on the machine's load.
    """
    outputs: dict[str, list[StepOutput]] = defaultdict(list)
    deadline = time.monotonic() + timeout_s
    while engine.has_unfinished():
        assert time.monotonic() < deadline, f"engine still busy after {timeout_s} s"
        for output in engine.step():
            outputs[output.request_id].append(output)
    return outputs


def run(engine, prompt: list[int], sampling: SamplingSpec, request_id: str) -> list[StepOutput]:
    engine.add_request(request_id, prompt, sampling)
    outputs = drain(engine)[request_id]
    check_stream(outputs, len(prompt), sampling.n)
    return outputs


def check_stream(outputs: list[StepOutput], prompt_tokens: int, n: int) -> None:
    """The contract every request's stream keeps, whatever its sampling."""
    assert [o.finished for o in outputs] == [False] * (len(outputs) - 1) + [True]
    assert all(o.prompt_tokens == prompt_tokens for o in outputs)
    running = 0
    finished_choices = []
    for output in outputs:
        assert output.choices, "a step output without new choices"
        running += sum(d.token_count for d in output.choices)
        assert output.completion_tokens == running
        finished_choices += [d.index for d in output.choices if d.finish_reason]
    assert sorted(finished_choices) == list(range(n))


def choices(outputs: list[StepOutput]) -> dict[int, list[ChoiceDelta]]:
    by_index: dict[int, list[ChoiceDelta]] = defaultdict(list)
    for output in outputs:
        for delta in output.choices:
            by_index[delta.index].append(delta)
    return by_index


def text(deltas: list[ChoiceDelta]) -> str:
    return "".join(d.text for d in deltas)


def test_greedy_answer_names_paris(engine, prompt_ids):
    prompt = prompt_ids(QUESTION)
    outputs = run(engine, prompt, SamplingSpec(max_tokens=24, temperature=0.0), "paris")
    deltas = choices(outputs)[0]
    assert "Paris" in text(deltas)
    assert deltas[-1].finish_reason == "stop"
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert all(d.logprobs is None for d in deltas)
    assert 0 < outputs[-1].completion_tokens < 24
    assert outputs[-1].completion_tokens == sum(d.token_count for d in deltas)


def test_max_tokens_ends_with_length(engine, prompt_ids):
    prompt = prompt_ids("Write a long poem about the sea.")
    outputs = run(engine, prompt, SamplingSpec(max_tokens=5, temperature=0.0), "length")
    deltas = choices(outputs)[0]
    assert deltas[-1].finish_reason == "length"
    assert outputs[-1].completion_tokens == 5
    assert text(deltas)


def test_n_choices_arrive_under_one_request(engine, prompt_ids):
    prompt = prompt_ids("Tell me a fun fact.")
    sampling = SamplingSpec(max_tokens=6, temperature=1.0, n=2, seed=7)
    outputs = run(engine, prompt, sampling, "two")
    by_index = choices(outputs)
    assert sorted(by_index) == [0, 1]
    for deltas in by_index.values():
        assert deltas[-1].finish_reason in ("stop", "length")
    per_choice = [sum(d.token_count for d in by_index[i]) for i in (0, 1)]
    assert outputs[-1].completion_tokens == sum(per_choice)


def test_the_first_logprobs_request_compiles_nothing(engine, prompt_ids):
    # vLLM ranks sampled tokens with a torch.compile'd function that Inductor compiled on a
    # runner's first logprobs request (~4 s to its first token on 2 cores, then ~0.2 s).
    # Placed before every other logprobs request of this module: it is the engine's first.
    from torch._dynamo.utils import counters

    compiled_before = sum(counters["frames"].values())
    sampling = SamplingSpec(max_tokens=2, temperature=0.0, logprobs=1)
    deltas = choices(run(engine, prompt_ids(QUESTION), sampling, "first-logprobs"))[0]
    assert all(d.logprobs for d in deltas)
    assert sum(counters["frames"].values()) == compiled_before, dict(counters["frames"])


def test_logprobs_have_top_alternatives(engine, prompt_ids):
    prompt = prompt_ids(QUESTION)
    sampling = SamplingSpec(max_tokens=4, temperature=0.0, logprobs=2)
    deltas = choices(run(engine, prompt, sampling, "logprobs"))[0]
    tokens = [lp for d in deltas for lp in (d.logprobs or [])]
    assert len(tokens) == sum(d.token_count for d in deltas) == 4
    for token in tokens:
        assert token.logprob <= 0.0
        assert token.bytes == list(token.token.encode("utf-8"))
        assert len(token.top) == 2
        assert token.top[0].logprob >= token.top[1].logprob
        assert all(alt.bytes == list(alt.token.encode("utf-8")) for alt in token.top)
        # Greedy: the sampled token is (one of) the most likely.
        assert token.logprob == pytest.approx(token.top[0].logprob, abs=1e-4)
    assert "".join(t.token for t in tokens) == text(deltas)


def test_json_object_output_parses(engine, prompt_ids):
    prompt = prompt_ids('Answer in JSON with the key "capital": ' + QUESTION)
    sampling = SamplingSpec(max_tokens=48, temperature=0.0, json_object=True)
    deltas = choices(run(engine, prompt, sampling, "json"))[0]
    assert deltas[-1].finish_reason == "stop"
    assert isinstance(json.loads(text(deltas)), dict)


def test_json_schema_is_followed(engine, prompt_ids):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    prompt = prompt_ids("Answer in JSON: " + QUESTION)
    sampling = SamplingSpec(max_tokens=32, temperature=0.0, json_schema=schema)
    deltas = choices(run(engine, prompt, sampling, "schema"))[0]
    assert deltas[-1].finish_reason == "stop"
    assert list(json.loads(text(deltas))) == ["city"]


def test_stop_string_is_excluded(engine, prompt_ids):
    prompt = prompt_ids(QUESTION)
    sampling = SamplingSpec(max_tokens=24, temperature=0.0, stop=["Paris"])
    deltas = choices(run(engine, prompt, sampling, "stop"))[0]
    assert deltas[-1].finish_reason == "stop"
    assert "Paris" not in text(deltas)
    assert "France" in text(deltas)


def test_abort_frees_the_request(engine, prompt_ids):
    prompt = prompt_ids("Write a long poem about the sea.")
    # n=2: vLLM runs two child requests, and both must go.
    doomed = SamplingSpec(max_tokens=200, temperature=1.0, n=2)
    engine.add_request("doomed", prompt, doomed)
    engine.add_request("kept", prompt, SamplingSpec(max_tokens=8, temperature=0.0))
    before = [output for _ in range(3) for output in engine.step()]
    assert {o.request_id for o in before} == {"doomed", "kept"}
    engine.abort(["doomed", "never-seen"])
    engine.abort(["doomed"])
    after = drain(engine)
    assert "doomed" not in after
    check_stream([o for o in before if o.request_id == "kept"] + after["kept"], len(prompt), 1)
    assert not engine.has_unfinished()
    # The id is free again.
    engine.add_request("doomed", prompt, SamplingSpec(max_tokens=1))
    engine.abort(["doomed"])


def test_invalid_sampling_is_a_request_error(engine, prompt_ids):
    prompt = prompt_ids(QUESTION)
    with pytest.raises(EngineRequestError, match="greedy"):
        engine.add_request("greedy-n", prompt, SamplingSpec(max_tokens=4, temperature=0.0, n=2))
    with pytest.raises(EngineRequestError):
        engine.add_request("too-long", prompt * 200, SamplingSpec(max_tokens=4))
    assert not engine.has_unfinished()
    # The engine still serves after refusing.
    outputs = run(engine, prompt, SamplingSpec(max_tokens=2, temperature=0.0), "after")
    assert outputs[-1].completion_tokens == 2


def test_kernel_overrides_are_installed_once_per_process(engine):
    # preload() installs vLLM's CPU stand-ins for Triton kernels while a stem waits; an
    # engine init after it must neither pay the scan again nor wrap the stand-ins twice.
    from vllm.platforms import current_platform
    from vllm.triton_utils.dispatcher import KernelOverride
    from vllm.v1.worker.block_table import ComputeSlotMappingKernel

    if current_platform.is_cuda_alike():
        pytest.skip("Triton runs natively on GPUs: no stand-ins to install")
    installed = ComputeSlotMappingKernel.kernel
    assert isinstance(installed, KernelOverride)
    current_platform.register_triton_kernel_overrides()
    assert ComputeSlotMappingKernel.kernel is installed


def test_every_vllm_patch_applied_to_the_installed_vllm(engine):
    from vllm.platforms import current_platform

    from ebb.runners import engine_patches

    expected = {
        "in-process-engine-core",
        "no-usage-stats",
        "logging-configured-early",
        "renderer-tokenizer-copies-on-demand",
    }
    if not current_platform.is_cuda_alike():
        expected |= {
            "kernel-overrides-once",
            "kv-cache-pages-on-demand",
            "embedding-packed-on-first-gemm",
            "cpu-kv-cache-space",
            "in-process-model-inspection",
            "logprob-ranks-eager",
        }
    # omp-threads is left out: it applies only if torch was not imported before the engine,
    # and this test session may have imported it first.
    applied = engine_patches.applied()
    assert expected <= set(applied)
    assert set(applied.values()) == {engine_patches.installed_version()}
