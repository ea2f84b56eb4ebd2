"""Engine options are checked against the platform at deploy time: each refusal is a 400
naming the option and what to change."""

from __future__ import annotations

import pytest

from ebb.engine_options import GpuCapacity, check_engine
from ebb.errors import InvalidRequest
from ebb.queue.gpu_records import GpuDevice, HostInventory
from ebb.queue.schema import EngineSpec

GIB = 1024**3
CPU = GpuCapacity()
TWO_H100 = GpuCapacity.of(
    [
        HostInventory(
            host="h",
            devices=[
                GpuDevice(index=i, uuid=f"u{i}", name="H100", total_bytes=80 * GIB, free_bytes=0)
                for i in range(2)
            ],
        ),
        HostInventory(host="cpu-only"),
    ]
)


def refusal(engine: EngineSpec, capacity: GpuCapacity, max_concurrency: int = 8) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        check_engine(engine, max_concurrency=max_concurrency, capacity=capacity)
    return caught.value


def test_capacity_of_inventories() -> None:
    assert TWO_H100.platform == "cuda"
    assert TWO_H100.most_gpus_per_host == 2 and TWO_H100.largest_device_bytes == 80 * GIB
    assert GpuCapacity.of([HostInventory(host="cpu-only")]).platform == "cpu"


def test_defaults_pass_everywhere() -> None:
    for capacity in (CPU, TWO_H100):
        check_engine(EngineSpec(), max_concurrency=32, capacity=capacity)


def test_every_option_that_fits_passes_on_gpus() -> None:
    engine = EngineSpec(
        dtype="bfloat16",
        quantization="fp8",
        max_num_seqs=64,
        tensor_parallel_size=2,
        enable_prefix_caching=True,
        gpu_memory_gib=120,
        enforce_eager=False,
    )
    check_engine(engine, max_concurrency=32, capacity=TWO_H100)


def test_unknown_dtype() -> None:
    error = refusal(EngineSpec(dtype="fp7"), CPU)
    assert error.param == "engine.dtype" and "bfloat16" in error.message


def test_quantization_depends_on_the_platform() -> None:
    error = refusal(EngineSpec(quantization="fp8"), CPU)
    assert error.param == "engine.quantization"
    assert "(cpu)" in error.message and "awq" in error.message
    check_engine(EngineSpec(quantization="awq"), max_concurrency=1, capacity=CPU)


def test_tensor_parallelism_needs_the_gpus_on_one_host() -> None:
    error = refusal(EngineSpec(tensor_parallel_size=4), TWO_H100)
    assert error.param == "engine.tensor_parallel_size"
    assert "the largest host has 2 GPUs: lower it to 2" in error.message
    assert "no host reports a GPU" in refusal(EngineSpec(tensor_parallel_size=2), CPU).message
    assert "one of 1, 2, 4, 8" in refusal(EngineSpec(tensor_parallel_size=3), TWO_H100).message


def test_memory_budget_must_fit_a_device() -> None:
    error = refusal(EngineSpec(gpu_memory_gib=100), TWO_H100)
    assert error.param == "engine.gpu_memory_gib"
    assert "100.0 GiB per GPU, more than the largest GPU (80.0 GiB)" in error.message
    check_engine(
        EngineSpec(gpu_memory_gib=100, tensor_parallel_size=2), max_concurrency=1, capacity=TWO_H100
    )


def test_max_num_seqs_below_max_concurrency() -> None:
    error = refusal(EngineSpec(max_num_seqs=4), CPU, max_concurrency=8)
    assert error.param == "engine.max_num_seqs"
    assert "raise max_num_seqs or lower max_concurrency" in error.message


def test_compiled_mode_is_refused_on_cpu() -> None:
    error = refusal(EngineSpec(enforce_eager=False), CPU)
    assert error.param == "engine.enforce_eager"


def test_a_cluster_shape_is_a_node_label_value_and_a_sane_host_memory() -> None:
    check_engine(
        EngineSpec(accelerator="NVIDIA-A100-SXM4-80GB", host_memory_gib=64),
        max_concurrency=1,
        capacity=TWO_H100,
    )
    for hostile in ("a100\nx", "-a100", "a" * 64, "NVIDIA A100", "a100/80"):
        assert refusal(EngineSpec(accelerator=hostile), CPU).param == "engine.accelerator"
    for memory in (0, -1, 5000):
        error = refusal(EngineSpec(host_memory_gib=memory), CPU)
        assert error.param == "engine.host_memory_gib"
