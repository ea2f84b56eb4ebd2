"""Fixtures shared by every test layer."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# Converted weights survive between local runs (the directory is git-ignored), so only the
# first run on a machine pays for the GGUF -> safetensors conversion.
TEST_WEIGHTS_DIR = REPO_ROOT / ".ebb" / "test-weights"


@pytest.fixture(scope="session")
def default_local_model():
    """The default model (SmolLM2-135M-Instruct) converted into the weight cache."""
    from ebb.config import DEFAULT_MODEL_SOURCE
    from ebb.weights_cache import ensure

    return ensure(DEFAULT_MODEL_SOURCE, TEST_WEIGHTS_DIR)
