"""`ebb status`'s GPU lines: a host without NVIDIA's driver says so quietly."""

from __future__ import annotations

import io

from rich.console import Console

from ebb.cli import deployments


def _printed(monkeypatch, hosts: list[dict]) -> str:
    out = io.StringIO()
    monkeypatch.setattr(deployments, "console", Console(file=out, width=200))
    deployments.print_gpus(hosts)
    return out.getvalue()


def test_a_host_without_nvml_has_no_nvidia_gpu_and_no_error_text(monkeypatch):
    text = _printed(
        monkeypatch,
        [{"host": "h", "devices": [], "note": "NVML: NVML Shared Library Not Found"}],
    )
    assert text == "h: no NVIDIA GPU (runners serve on the CPU)\n"
    other = _printed(monkeypatch, [{"host": "h", "devices": [], "note": "fake"}])
    assert other == "h: no GPUs (fake)\n"
