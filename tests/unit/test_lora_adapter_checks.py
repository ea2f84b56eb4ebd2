"""LoRA adapters: the checks against a base (`ebb.weights_cache.adapters`), caching an
adapter directory, the runner's adapter account, the fake engine's adapters and the
claim affinity key."""

from __future__ import annotations

import json
import os
import threading

import pytest
from support.lora import TINY_CONFIG, write_adapter, write_raw_safetensors

from ebb.engine_options import GpuCapacity, LoraLimits, check_engine, lora_limits
from ebb.errors import InvalidRequest
from ebb.frontdoor.quotas import footprint, use_of
from ebb.queue.prefix import affinity_key, prefix_key
from ebb.queue.schema import AdapterRef, DeploymentSpec, EngineSpec, SamplingSpec, WorkItem
from ebb.queue.versions import TrafficSplit
from ebb.runners.adapters import RunnerAdapters
from ebb.runners.engine import EngineOptions, EngineRequestError, LoraAdapter
from ebb.testing.fake_engine import FakeEngine
from ebb.testing.fake_model import FAKE_REPLY
from ebb.weights_cache.adapters import (
    AdapterError,
    check_against_base,
    ensure_adapter,
    read_adapter,
)


def test_an_adapter_that_fits_its_base_passes(tmp_path):
    facts = read_adapter(write_adapter(tmp_path / "a", rank=8))
    assert facts.rank == 8 and facts.target_modules == {"q_proj", "v_proj"}
    assert facts.shapes[(1, "v_proj")] == (64, 32)
    check_against_base(facts, TINY_CONFIG, max_lora_rank=16)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"rank": 32}, "above its base's max_lora_rank 16"),
        ({"hidden": 96}, "trained for another architecture"),
        ({"config": {**TINY_CONFIG, "num_hidden_layers": 4}}, "its base has 2 layers"),
    ],
)
def test_an_adapter_its_base_cannot_serve_is_refused_saying_why(tmp_path, kwargs, says):
    facts = read_adapter(write_adapter(tmp_path / "a", **kwargs))
    with pytest.raises(AdapterError, match=says):
        check_against_base(facts, TINY_CONFIG, max_lora_rank=16)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"targets": ("q_proj", "embed_tokens")}, "targets 1 module\\(s\\) the engine cannot"),
        ({"modules_to_save": ["lm_head"]}, "train the adapter without modules_to_save"),
        ({"use_dora": True}, "without use_dora"),
        ({"peft_type": "IA3"}, "only LoRA adapters"),
    ],
)
def test_an_adapter_config_the_engine_cannot_serve_is_refused(tmp_path, extra, says):
    with pytest.raises(AdapterError, match=says):
        read_adapter(write_adapter(tmp_path / "a", **extra))


def test_missing_files_are_named(tmp_path):
    root = write_adapter(tmp_path / "a")
    (root / "adapter_model.safetensors").unlink()
    with pytest.raises(AdapterError, match="no adapter_model.safetensors"):
        read_adapter(root)
    (root / "adapter_config.json").unlink()
    with pytest.raises(AdapterError, match="no adapter_config.json"):
        read_adapter(root)


WEIGHT = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


@pytest.mark.parametrize(
    "shape",
    [
        b'["8", 64]',
        b"[8.5, 64]",
        b"[true, 64]",
        b"[8, 1e400]",
        b"[8, " + b"9" * 5000 + b"]",
        b"[8, 100000000000000000000]",
        b"[0, 64]",
        b"[8, -64]",
        b"[8]",
        b"{}",
    ],
)
def test_a_malformed_lora_shape_is_an_adapter_error(tmp_path, shape):
    root = write_adapter(tmp_path / "a")
    header = b'{"%s": {"dtype": "F32", "shape": %s, "data_offsets": [0, 4]}}' % (
        WEIGHT.encode(),
        shape,
    )
    write_raw_safetensors(root / "adapter_model.safetensors", header)
    with pytest.raises(AdapterError, match="safetensors"):
        read_adapter(root)


def test_a_safetensors_header_longer_than_its_file_is_refused(tmp_path):
    root = write_adapter(tmp_path / "a")
    with (root / "adapter_model.safetensors").open("r+b") as f:
        f.write((2**20).to_bytes(8, "little"))
    with pytest.raises(AdapterError, match="implausible header"):
        read_adapter(root)


def test_messages_quote_nothing_from_the_files(tmp_path):
    secret = "SECRET-from-the-file"
    for fields in (
        {"peft_type": secret},
        {"r": secret},
        {"use_dora": secret},
        {"modules_to_save": [secret]},
        {"target_modules": secret},
        {"target_modules": [secret]},
    ):
        root = write_adapter(tmp_path / "a")
        config = json.loads((root / "adapter_config.json").read_text())
        (root / "adapter_config.json").write_text(json.dumps({**config, **fields}))
        with pytest.raises(AdapterError) as refused:
            read_adapter(root)
        assert secret not in refused.value.message, fields
    (root / "adapter_config.json").write_text("{" + json.dumps(secret) + ": }")
    with pytest.raises(AdapterError, match="not valid JSON") as refused:
        read_adapter(root)
    assert secret not in refused.value.message


def test_an_oversized_or_deep_config_is_refused_before_it_is_parsed(tmp_path):
    root = write_adapter(tmp_path / "a")
    (root / "adapter_config.json").write_text(" " * (1024 * 1024 + 1) + "{}")
    with pytest.raises(AdapterError, match="larger than 1048576 bytes"):
        read_adapter(root)
    (root / "adapter_config.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(AdapterError, match="not valid JSON"):
        read_adapter(root)


def test_symbolic_links_are_refused_wherever_they_are(tmp_path):
    real = write_adapter(tmp_path / "outside" / "a")
    (tmp_path / "allowed").mkdir()
    (tmp_path / "allowed" / "link").symlink_to(real)  # a directory link under a prefix
    with pytest.raises(AdapterError, match="without symbolic links"):
        read_adapter(tmp_path / "allowed" / "link")
    (tmp_path / "allowed" / "up").symlink_to(tmp_path / "outside")  # a link higher up
    with pytest.raises(AdapterError, match="without symbolic links"):
        read_adapter(tmp_path / "allowed" / "up" / "a")
    for name, target in (
        ("adapter_config.json", real / "adapter_config.json"),
        ("adapter_model.safetensors", "/dev/zero"),
    ):
        root = write_adapter(tmp_path / f"files-{len(name)}")
        (root / name).unlink()
        (root / name).symlink_to(target)
        with pytest.raises(AdapterError, match=f"{name} is not a regular file"):
            read_adapter(root)


@pytest.mark.parametrize("name", ["adapter_config.json", "adapter_model.safetensors"])
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path, name):
    root = write_adapter(tmp_path / "a")
    (root / name).unlink()
    os.mkfifo(root / name)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            read_adapter(root)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            outcome.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # blocked opening the FIFO: a writer releases it
        os.close(os.open(root / name, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=10)
        pytest.fail(f"reading an adapter whose {name} is a FIFO blocked")
    assert isinstance(outcome[0], AdapterError), outcome
    assert f"{name} is not a regular file" in outcome[0].message


def test_an_adapter_is_cached_and_verified_like_weights(tmp_path):
    root = write_adapter(tmp_path / "a")
    local = ensure_adapter(str(root), tmp_path / "cache")
    assert local.path == root and local.max_model_len == 0
    (root / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    with pytest.raises(AdapterError, match="no target_modules"):
        ensure_adapter(str(root), tmp_path / "cache")


def test_lora_options_need_enable_lora_and_a_supported_rank():
    cpu = GpuCapacity.of([])
    with pytest.raises(InvalidRequest, match="set engine.enable_lora=true"):
        check_engine(EngineSpec(max_loras=2), max_concurrency=1, capacity=cpu)
    with pytest.raises(InvalidRequest, match="max_lora_rank must be one of"):
        check_engine(
            EngineSpec(enable_lora=True, max_lora_rank=12), max_concurrency=1, capacity=cpu
        )
    assert lora_limits(EngineSpec()) is None
    assert lora_limits(EngineSpec(enable_lora=True, max_loras=8)) == LoraLimits(8, 16, 16)


def _work(ref: AdapterRef | None, request_id: str = "r1") -> WorkItem:
    return WorkItem(
        request_id=request_id,
        deployment="base",
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingSpec(max_tokens=4),
        adapter=ref,
    )


def test_a_runner_keeps_its_adapters_lru_and_counts_cold_loads(tmp_path):
    limits = LoraLimits(max_loras=1, max_lora_rank=16, max_cpu_loras=2)
    adapters = RunnerAdapters(tmp_path / "cache", limits=limits)
    refs = [
        AdapterRef(name=n, uid=f"dep_{n}", source=str(write_adapter(tmp_path / n)))
        for n in ("a", "b", "c")
    ]
    assert adapters.for_work(_work(None)) is None
    first = adapters.for_work(_work(refs[0]))
    assert adapters.for_work(_work(refs[0])) == first and adapters.cold_loads == 1
    adapters.for_work(_work(refs[1]))
    adapters.for_work(_work(refs[2]))  # evicts a, the least recent
    assert adapters.cold_loads == 3
    again = adapters.for_work(_work(refs[0]))
    assert adapters.cold_loads == 4 and again.int_id != first.int_id


def test_a_runner_without_lora_fails_an_adapters_request_saying_what_to_change(tmp_path):
    ref = AdapterRef(name="a", uid="dep_a", source=str(write_adapter(tmp_path / "a")))
    with pytest.raises(EngineRequestError, match="engine.enable_lora=true"):
        RunnerAdapters(tmp_path / "cache", limits=None).for_work(_work(ref))
    big = AdapterRef(name="big", uid="dep_b", source=str(write_adapter(tmp_path / "b", rank=64)))
    with pytest.raises(EngineRequestError, match="max_lora_rank 16"):
        RunnerAdapters(tmp_path / "cache", limits=LoraLimits(1, 16, 1)).for_work(_work(big))


def _run(engine: FakeEngine, request_id: str, lora: LoraAdapter | None) -> str:
    engine.add_request(request_id, [1, 2, 3], SamplingSpec(max_tokens=64), lora=lora)
    text = ""
    while engine.has_unfinished():
        for out in engine.step():
            text += "".join(c.text for c in out.choices)
    return text


def test_the_fake_engine_answers_per_adapter_and_keeps_them_lru(tmp_path):
    options = EngineOptions(
        model_path=None, max_model_len=1024, source="fake://m", lora=LoraLimits(1, 16, 2)
    )
    engine = FakeEngine.load(options)
    a, b, c = (LoraAdapter(n, i, tmp_path) for i, n in enumerate("abc", start=1))
    assert _run(engine, "base", None) == (FAKE_REPLY * 8)[:64]
    assert _run(engine, "a1", a).startswith("[a] ")
    assert _run(engine, "b1", b).startswith("[b] ")
    assert _run(engine, "a2", a) == _run(engine, "a3", a)
    _run(engine, "c1", c)
    assert list(engine.loaded_adapters.values()) == ["a", "c"] and engine.adapter_loads == 3
    plain = FakeEngine.load(EngineOptions(model_path=None, max_model_len=1024, source="fake://m"))
    with pytest.raises(EngineRequestError, match="without LoRA"):
        plain.add_request("x", [1], SamplingSpec(max_tokens=1), lora=a)


def test_an_adapters_requests_share_one_affinity_key_whatever_their_prompt():
    ref = AdapterRef(name="a", uid="dep_a", source="/x")
    first, other = _work(ref), WorkItem(**{**_fields(_work(ref)), "prompt_token_ids": [9] * 300})
    assert affinity_key(first) == affinity_key(other) == "lora-dep_a"
    plain = _work(None)
    assert affinity_key(plain) == prefix_key(plain.prompt_token_ids)


def _fields(work: WorkItem) -> dict:
    return {f: getattr(work, f) for f in work.__struct_fields__}


def test_an_adapter_counts_against_a_quota_as_a_deployment_without_runners():
    adapter = DeploymentSpec(name="a", source="/x", base="b", max_replicas=4)
    use = use_of([footprint(adapter, TrafficSplit(weights={1: 100}), {})])
    assert (use.deployments, use.replicas, use.gpus) == (1, 0, 0)
