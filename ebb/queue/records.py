"""How platform records are laid out in Redis hashes (field per attribute)."""

from __future__ import annotations

import enum
from collections.abc import Mapping

import msgspec

from ebb.queue.schema import RunnerRecord

# Weight of the newest cold start in the moving average: recent starts matter most, one
# outlier (a page-cache miss) does not dominate.
COLD_START_EMA_WEIGHT = 0.3


def encode_runner(record: RunnerRecord | Mapping[str, object]) -> dict[str, str]:
    fields = msgspec.structs.asdict(record) if isinstance(record, RunnerRecord) else record
    return {name: _text(value) for name, value in fields.items()}


def decode_runner(raw: Mapping[bytes, bytes]) -> RunnerRecord | None:
    if not raw or b"runner_id" not in raw:
        return None
    fields = {k.decode(): v.decode() for k, v in raw.items()}
    known = set(RunnerRecord.__struct_fields__)
    return msgspec.convert(
        {k: v for k, v in fields.items() if k in known}, RunnerRecord, strict=False
    )


def cold_start_field(tier: str, phase: str) -> str:
    return f"{tier}:{phase}"


def parse_cold_start(raw: Mapping[bytes, bytes]) -> dict[str, dict[str, float]]:
    """{tier: {phase: moving-average ms}} from a deployment's cold-start hash."""
    result: dict[str, dict[str, float]] = {}
    for field, value in raw.items():
        tier, _, phase = field.decode().partition(":")
        result.setdefault(tier, {})[phase] = float(value)
    return result


def _text(value: object) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
