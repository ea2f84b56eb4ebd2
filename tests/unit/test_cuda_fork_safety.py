"""Processes that fork (the fork server, stems) never initialise CUDA: device discovery
goes through NVML, and a fork server that finds a CUDA context in itself turns the
forked tier off with the reason instead of handing out broken children."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
import torch

from ebb.coldstart.fork_client import ForkServerClient
from ebb.gpus import count, nvml
from ebb.queue.gpu_records import GpuPlacement
from ebb.runners import devices, engine_vllm


def _forbidden(*_args: object) -> None:
    raise AssertionError("torch.cuda was asked, which initialises CUDA without NVML")


def test_device_discovery_never_asks_torch_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", _forbidden)
    monkeypatch.setattr(torch.cuda, "device_count", _forbidden)
    monkeypatch.setattr(torch.cuda, "init", _forbidden)
    # No NVML on this machine: no GPUs, and CUDA stays uninitialised.
    assert engine_vllm._has_cuda() is False
    assert count.visible_gpu_count() == 0
    assert not torch.cuda.is_initialized()
    assert devices.fork_unsafe_reason() is None


def test_hidden_devices_count_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(count, "read_devices", _forbidden)
    monkeypatch.setattr(nvml, "read_devices", _forbidden)
    assert count.visible_gpu_count({"CUDA_VISIBLE_DEVICES": "-1"}) == 0
    assert count.visible_gpu_count({"CUDA_VISIBLE_DEVICES": ""}) == 0


def test_a_cuda_context_makes_forking_unsafe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    reason = devices.fork_unsafe_reason()
    assert reason is not None and "CUDA was initialised" in reason
    placement = GpuPlacement(
        host="h", device_indexes=[0], reserved_bytes_per_device=1, gpu_memory_utilization=0.1
    )
    with pytest.raises(RuntimeError, match="already initialised"):
        devices.use_placement(placement)


def test_placement_restricts_the_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    placement = GpuPlacement(
        host="h", device_indexes=[1, 3], reserved_bytes_per_device=1, gpu_memory_utilization=0.5
    )
    devices.use_placement(placement)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,3"


def test_a_fork_server_that_refuses_turns_the_forked_tier_off(tmp_path) -> None:
    event = json.dumps({"event": "disabled", "reason": "CUDA was initialised in it"})
    command = (sys.executable, "-c", f"print({event!r}, flush=True)")
    client = ForkServerClient({}, tmp_path / "fork.log", command=command)
    deadline = time.monotonic() + 30
    while not client.disabled_reason and time.monotonic() < deadline:
        client.poll()
        time.sleep(0.02)
    assert client.disabled_reason == "CUDA was initialised in it"
    client._proc.wait(timeout=30)
    assert client.poll() == [] and not client.ready() and not client.starting()
    assert client._restart_at == 0.0, "a disabled fork server must not be restarted"
    client.close()
