"""One GPU module (`ebb.gpus`): the CUDA_VISIBLE_DEVICES parser, the NVML record, and the one
count of a runner's GPUs that the runner and billing (its own meter, the controller's
closing of it) both use."""

from __future__ import annotations

import sys
import types

import msgspec
import pytest

from ebb.billing.gpu import meter_for
from ebb.coldstart.gpu_reader import GpuReader
from ebb.config import Settings
from ebb.gpus import count, nvml
from ebb.gpus.visible import visible_devices, visible_indices
from ebb.queue.gpu_records import GpuDevice, GpuPlacement
from ebb.queue.observations import RunnerStats

GIB = 2**30


class FakeNvml:
    """NVML as nvidia-ml-py presents it: two GPUs."""

    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        self.initialised = 0

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        self.initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> types.SimpleNamespace:  # noqa: N802
        used = (handle + 1) * GIB
        return types.SimpleNamespace(used=used, free=80 * GIB - used - GIB, total=80 * GIB)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> types.SimpleNamespace:  # noqa: N802
        return types.SimpleNamespace(gpu=40 + handle)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:  # noqa: N802
        return 60 + handle

    def nvmlDeviceGetName(self, handle: int) -> bytes:  # noqa: N802
        return b"NVIDIA H100 80GB HBM3"  # older nvidia-ml-py returns bytes

    def nvmlDeviceGetUUID(self, handle: int) -> str:  # noqa: N802
        return f"GPU-{handle:08d}"


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


@pytest.mark.parametrize(
    ("value", "devices"),
    [
        (None, None),  # unset: every device
        ("", []),
        ("  ", []),
        ("-1", []),
        ("NoDevFiles", []),
        ("0,1", ["0", "1"]),
        (" 3 , 1 ,", ["3", "1"]),
        ("GPU-aa,MIG-bb", ["GPU-aa", "MIG-bb"]),
        ("all", ["all"]),  # not a CUDA value: one named device, like any other name
    ],
)
def test_visible_devices_has_one_meaning_per_value(value: str | None, devices: object) -> None:
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert visible_devices(env) == devices


def test_visible_indices_of_a_host() -> None:
    assert visible_indices(4, {}) == [0, 1, 2, 3]
    assert visible_indices(4, {"CUDA_VISIBLE_DEVICES": "3,1,7"}) == [3, 1]  # 7: not here
    assert visible_indices(4, {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}) == [0, 1]
    assert visible_indices(4, {"CUDA_VISIBLE_DEVICES": ""}) == []


def test_nvml_reads_each_gpu_into_one_record_in_bytes(fake_nvml: FakeNvml) -> None:
    first, second = nvml.read_devices()
    assert second == GpuDevice(
        index=1,
        uuid="GPU-00000001",
        name="NVIDIA H100 80GB HBM3",
        total_bytes=80 * GIB,
        free_bytes=77 * GIB,
        used_bytes=2 * GIB,
        utilization_pct=41,
        temperature_c=61,
    )
    assert first.index == 0 and fake_nvml.initialised == 0  # shut down after the read


def test_the_figures_reader_reads_the_visible_gpus(
    fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    [second] = nvml.reader({"CUDA_VISIBLE_DEVICES": "1"})()
    assert second == nvml.read_devices()[1]  # the same record as the inventory's
    assert len(nvml.reader({})()) == 2
    assert nvml.reader({"CUDA_VISIBLE_DEVICES": "-1"})() == []
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: no GPUs, no error
    assert nvml.reader({})() == []
    with pytest.raises(nvml.NvmlUnavailable, match="not installed"):
        nvml.read_devices()


def test_visible_gpu_count_reads_nvml_narrowed_by_the_environment(fake_nvml: FakeNvml) -> None:
    assert count.visible_gpu_count({}) == 2
    assert count.visible_gpu_count({"CUDA_VISIBLE_DEVICES": "1"}) == 1
    assert count.visible_gpu_count({"CUDA_VISIBLE_DEVICES": "-1"}) == 0


def _placement(*indexes: int) -> GpuPlacement:
    return GpuPlacement(
        host="h",
        device_indexes=list(indexes),
        reserved_bytes_per_device=GIB,
        gpu_memory_utilization=0.5,
    )


def test_a_runner_holds_its_placements_gpus_else_those_named_for_it() -> None:
    named = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert count.held_gpus(_placement(1, 3), named) == 2  # the placement decides
    assert count.held_gpus(None, named) == 4  # a Ray actor's devices
    assert count.held_gpus(None, {}) == 0  # unset: an unassigned stem, a CPU runner
    assert count.held_gpus(None, {"CUDA_VISIBLE_DEVICES": "-1"}) == 0
    assert [count.billed_gpus(n) for n in (0, 1, 4)] == [1, 1, 4]


class _Placements:
    """GpuState's read the GPU reader makes, holding one runner's placement."""

    def __init__(self, placements: dict[str, GpuPlacement]) -> None:
        self._placements = placements

    async def placements(self) -> dict[str, GpuPlacement]:
        return self._placements


@pytest.mark.parametrize("placement", [_placement(0, 2), None])
async def test_billing_and_the_runner_count_the_same_gpus(placement: GpuPlacement | None) -> None:
    """The runner meters itself with `held_gpus(placement)`; the controller closes a dead
    runner's meter with the GPU reader's count: both bill the same GPUs."""
    held = {"r-1": placement} if placement else {}
    reader = GpuReader(Settings(), gpus=_Placements(held))  # type: ignore[arg-type]
    by_runner = meter_for("r-1", None, count.held_gpus(placement, {}))
    by_controller = meter_for("r-1", None, await reader.gpu_count("r-1"))
    assert by_runner.gpu_count == by_controller.gpu_count == (2 if placement else 1)


def test_a_runners_gpu_records_reach_metrics_in_the_metrics_units(fake_nvml: FakeNvml) -> None:
    """The runner publishes its GPUs as `GpuDevice` records through Redis (JSON); /metrics
    renders them as a ratio, bytes and degrees."""
    from ebb.frontdoor.metrics_scraped import _runner_families

    [gpu] = nvml.reader({"CUDA_VISIBLE_DEVICES": "1"})()
    sent = RunnerStats(runner_id="r-1", deployment="m", batch_size=0, gpus=[gpu])
    stats = msgspec.json.decode(msgspec.json.encode(sent), type=RunnerStats)
    samples = {
        s.name: (s.labels["gpu"], s.value)
        for family in _runner_families([stats])
        for s in family.samples
        if s.name.startswith("ebb_gpu_")
    }
    assert samples == {
        "ebb_gpu_utilization_ratio": ("1", 0.41),
        "ebb_gpu_memory_used_bytes": ("1", 2 * GIB),
        "ebb_gpu_temperature_celsius": ("1", 61),
    }
