"""This host's GPUs, as the controller publishes them: NVML, or a fake file in tests.

A host without NVML (no driver, no library) reports no devices and a note saying why;
it runs runners on CPU as before. With test engines on (`EBB_TEST_ENGINES=1`),
`EBB_GPU_INVENTORY_FILE` names a JSON list of `GpuDevice` objects read instead of NVML,
so placement can be exercised on a machine without GPUs.
"""

from __future__ import annotations

import logging
import socket
import time

import msgspec

from ebb.config import Settings
from ebb.gpus.nvml import NvmlUnavailable, read_devices
from ebb.queue.gpu_records import GpuDevice, HostInventory

log = logging.getLogger(__name__)

_fake_devices = msgspec.json.Decoder(list[GpuDevice])


def host_name() -> str:
    return socket.gethostname()


def read_host_inventory(settings: Settings) -> HostInventory:
    """The GPUs of this host now; never raises for a host that has none."""
    now_ms = int(time.time() * 1000)
    if settings.test_engines and settings.gpu_inventory_file is not None:
        devices = _fake_devices.decode(settings.gpu_inventory_file.read_bytes())
        return HostInventory(host=host_name(), devices=devices, read_at_ms=now_ms, note="fake")
    try:
        devices = read_devices()
    except NvmlUnavailable as e:
        return HostInventory(host=host_name(), read_at_ms=now_ms, note=str(e))
    return HostInventory(host=host_name(), devices=devices, read_at_ms=now_ms)
