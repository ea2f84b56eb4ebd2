"""Fixtures shared by every test layer."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from support import TEMP_HOMES, TEST_WEIGHTS_DIR
from support.webhook_receiver import Receiver


def pytest_configure(config: pytest.Config) -> None:
    # The switch that registers the test engines (`fake://` sources, see ebb.engines). Set
    # before any test builds Settings or starts a process, so every frontdoor, controller
    # and runner the session starts inherits it.
    os.environ["EBB_TEST_ENGINES"] = "1"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Every fixture has been torn down by now, so no platform process still writes there.
    if exitstatus == pytest.ExitCode.OK:
        for home in TEMP_HOMES:
            shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def _process_environment_kept() -> Iterator[None]:
    """Each module leaves this process's environment as it found it. An engine loaded in
    this process (tests/e2e/test_engine_vllm.py) sets vLLM's and torch's variables
    (`LD_PRELOAD` of torch's libgomp, `VLLM_*`, ...), and every platform a later module
    started inherited them: its runners computed on 2 threads on 2 cores, unlike any
    runner `ebb up` starts, and so were never given a core of their own."""
    kept = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(kept)


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


# For modules that define (or inherit) a `platform` fixture: an HTTP client carrying the
# admin key, and a client of the platform's own Redis.


@pytest.fixture(scope="module")
def admin(platform):
    with platform.admin() as client:
        yield client


@pytest.fixture(scope="module")
def platform_redis(platform):
    return platform.redis()
