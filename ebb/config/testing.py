"""Settings only the test session sets, apart from the operators'."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class TestingSettings(BaseModel):
    """For tests, not for operators: knobs only the test session sets.

    Production never needs them; they let tests run the platform without a GPU or vLLM.
    """

    __test__ = False  # a settings group, not a pytest test class

    test_engines: bool = Field(
        default=False,
        description="Accept the test engines' sources (`fake://`, see `ebb.engines`). The "
        "test session sets `EBB_TEST_ENGINES=1` for every process it starts; off, such a "
        "source is a `400`.",
    )
    gpu_inventory_file: Path | None = Field(
        default=None,
        description="With `EBB_TEST_ENGINES=1`: a JSON list of fake GPUs the controller "
        "reads instead of NVML.",
    )
