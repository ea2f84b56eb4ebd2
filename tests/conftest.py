"""Fixtures shared by every test layer."""

from __future__ import annotations

import pytest
from support import TEST_WEIGHTS_DIR
from webhook_receiver import Receiver


@pytest.fixture(scope="session")
def default_local_model():
    """The default model (SmolLM2-135M-Instruct) converted into the weight cache."""
    from ebb.config import DEFAULT_MODEL_SOURCE
    from ebb.weights_cache import ensure

    return ensure(DEFAULT_MODEL_SOURCE, TEST_WEIGHTS_DIR)


@pytest.fixture
def receiver():
    """A local webhook receiver (HTTP on 127.0.0.1) that accepts every delivery."""
    r = Receiver().start()
    yield r
    r.stop()
