"""What a runner pod of a deployment asks of its node: GPUs from its tensor parallel size,
memory from its model's weights (not a constant) unless the deployment says, the node's
GPU model from its engine.accelerator; a stem the template's."""

from __future__ import annotations

from ebb.coldstart.k8s_pods import GIB, RunnerShape
from ebb.coldstart.k8s_shapes import runner_shape
from ebb.config import Settings
from ebb.engines import EngineRegistry
from ebb.queue.schema import DeploymentSpec, EngineSpec

SETTINGS = Settings(test_engines=True, k8s_runner_memory_base_bytes=4 * GIB, kv_cache_gib=2)
ENGINES = EngineRegistry.from_settings(SETTINGS)


def spec(source: str, **engine: object) -> DeploymentSpec:
    return DeploymentSpec(name="m", source=source, engine=EngineSpec(**engine))  # type: ignore[arg-type]


def test_memory_follows_the_models_weights():
    small = runner_shape(SETTINGS, ENGINES, spec("fake://s?gpu_gib=1", tensor_parallel_size=1))
    large = runner_shape(SETTINGS, ENGINES, spec("fake://l?gpu_gib=40", tensor_parallel_size=2))
    assert small == RunnerShape(gpus=1, memory_bytes=5 * GIB)
    assert large == RunnerShape(gpus=2, memory_bytes=44 * GIB)
    cpu = runner_shape(SETTINGS, ENGINES, spec("fake://c?gpu_gib=1"))
    assert cpu == RunnerShape(gpus=0, memory_bytes=(4 + 1 + 2) * GIB), "a CPU runner's KV cache"


def test_a_deployment_says_its_host_memory_and_its_gpu_model():
    shaped = spec(
        "fake://s?gpu_gib=1",
        tensor_parallel_size=4,
        host_memory_gib=100,
        accelerator="NVIDIA-H100-80GB-HBM3",
    )
    assert runner_shape(SETTINGS, ENGINES, shaped) == RunnerShape(
        gpus=4, memory_bytes=100 * GIB, accelerator="NVIDIA-H100-80GB-HBM3"
    )


def test_weights_not_prepared_yet_and_stems_take_the_templates_memory(tmp_path):
    settings = Settings(weights_cache_dir=tmp_path, k8s_gpus_per_runner=1)
    unprepared = runner_shape(settings, EngineRegistry(), spec("hf://org/model"))
    assert unprepared == RunnerShape(gpus=1, memory_bytes=None)
    assert runner_shape(settings, EngineRegistry(), None) == RunnerShape()
