"""A deployment's engine options reach the real vLLM engine on the default model, and
the engine's imports (what a stem or the fork server does before it forks) leave CUDA
uninitialised. Each in its own interpreter: an engine per process, as runners have."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from support import REPO_ROOT

pytestmark = pytest.mark.e2e


def run_script(source: str, timeout_s: float = 300) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_engine_options_reach_vllm(default_local_model):
    got = run_script(
        f"""
        import json
        from pathlib import Path
        from ebb.config import Settings
        from ebb.queue.schema import DeploymentSpec, EngineSpec, SamplingSpec
        from ebb.runners.engine_vllm import VllmEngine
        from ebb.runners.loading import engine_options

        spec = DeploymentSpec(
            name="opts",
            source="unused",
            max_concurrency=2,
            max_model_len=1024,
            engine=EngineSpec(max_num_seqs=3, enable_prefix_caching=False, dtype="float32"),
        )
        options = engine_options(
            Settings(), spec, Path({str(default_local_model.path)!r}), 2048, None
        )
        engine = VllmEngine.load(options)
        config = engine._engine.vllm_config
        print(json.dumps({{
            "max_num_seqs": config.scheduler_config.max_num_seqs,
            "prefix_caching": config.cache_config.enable_prefix_caching,
            "dtype": str(config.model_config.dtype),
            "max_model_len": config.model_config.max_model_len,
            "eager": config.model_config.enforce_eager,
        }}))
        engine.shutdown()
        """
    )
    assert got == {
        "max_num_seqs": 3,
        "prefix_caching": False,
        "dtype": "torch.float32",
        "max_model_len": 1024,
        "eager": True,
    }


def test_engine_imports_leave_cuda_uninitialised():
    got = run_script(
        """
        import json, os
        import torch

        asked = []
        real = torch.cuda.is_available

        def is_available():
            asked.append(os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"))
            return real()

        torch.cuda.is_available = is_available
        from ebb.runners.devices import fork_unsafe_reason
        from ebb.runners.loading import import_engine_libraries

        import_engine_libraries()
        print(json.dumps({
            "initialized": torch.cuda.is_initialized(),
            "asked_without_nvml": [a for a in asked if a != "1"],
            "nvml_check": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"),
            "fork_unsafe": fork_unsafe_reason(),
        }))
        """
    )
    assert got == {
        "initialized": False,
        "asked_without_nvml": [],
        "nvml_check": "1",
        "fork_unsafe": None,
    }
