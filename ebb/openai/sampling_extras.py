"""vLLM's sampling parameters beyond OpenAI's, and OpenAI's `logit_bias`, validated.

vLLM's own OpenAI server accepts these as extra top-level fields of both endpoints' bodies
(clients send them through `extra_body`); ebb takes the same names and meanings. The
bounds here are the ones vLLM's `SamplingParams` enforces, checked before anything is
queued so that a bad value is a 400 naming the field rather than a failed request. Checks
that need the model (token ids inside its vocabulary, `min_tokens` against the completion
budget) are `translate.py`'s.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

# OpenAI's bound on a logit bias; vLLM clamps to it too.
MAX_LOGIT_BIAS = 100.0
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_TOKEN_ID_LIST = 1024

# Parameters of vLLM's server that only mean something for beam search, which ebb does not
# run; their neutral values are accepted (SDKs and ports of vLLM clients send them).
BEAM_ONLY: dict[str, tuple[str, tuple[Any, ...]]] = {
    "use_beam_search": ("beam search is not supported", (None, False)),
    "length_penalty": (
        "length_penalty applies only to beam search, which is not supported",
        (None, 1.0, 1),
    ),
}


def _invalid(message: str, *, at: str | int | None = None) -> PydanticCustomError:
    # The same error type schema.py renders: `ebb_message` is the whole message.
    return PydanticCustomError("ebb_invalid", "{ebb_message}", {"ebb_message": message, "at": at})


class SamplingExtras(BaseModel):
    """vLLM's extra sampling fields; None (or absent) means vLLM's default."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    # -1 (vLLM's old spelling) and 0 both mean "all tokens".
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0, le=10)
    min_tokens: int | None = Field(default=None, ge=0)
    stop_token_ids: list[int] | None = Field(default=None, max_length=MAX_TOKEN_ID_LIST)
    allowed_token_ids: list[int] | None = Field(
        default=None, min_length=1, max_length=MAX_TOKEN_ID_LIST
    )
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    # OpenAI's shape: token ids as JSON object keys (strings), bias in [-100, 100].
    logit_bias: dict[str, float] | None = None

    @field_validator("stop_token_ids", "allowed_token_ids")
    @classmethod
    def _non_negative_ids(cls, value: list[int] | None) -> list[int] | None:
        for i, token_id in enumerate(value or []):
            if token_id < 0:
                raise _invalid(f"token ids must be at least 0; got {token_id}", at=i)
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias_by_token_id(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        if len(value) > MAX_LOGIT_BIAS_ENTRIES:
            raise _invalid(
                f"logit_bias may hold at most {MAX_LOGIT_BIAS_ENTRIES} tokens; got {len(value)}"
            )
        for key, bias in value.items():
            if not key.isascii() or not key.isdigit():
                raise _invalid(
                    f'logit_bias keys must be token ids written as strings, like "42"; got {key!r}',
                    at=key,
                )
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise _invalid(
                    f"logit_bias values must be between -100 and 100; got {bias} for {key}",
                    at=key,
                )
        return value

    def token_ids_named(self) -> dict[str, list[int]]:
        """Every token id the request names, by the parameter it came in."""
        named = {
            "stop_token_ids": list(self.stop_token_ids or []),
            "allowed_token_ids": list(self.allowed_token_ids or []),
            "logit_bias": [int(k) for k in (self.logit_bias or {})],
        }
        return {param: ids for param, ids in named.items() if ids}
