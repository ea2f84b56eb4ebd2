"""vLLM's tokenizer endpoints: POST /tokenize and POST /detokenize (at the root, as vLLM
serves them; `vllm bench serve` and guidellm call them there).

`{model, prompt}` gives the ids a completions request with that prompt sends the engine,
`{model, messages, tools?}` those of a chat request (the deployment's chat template, tool
prompt and generation prompt), both as `{count, max_model_len, tokens, token_strs}`;
`{model, tokens}` gives `{prompt}`, the ids' text. The model is found as for chat: a
caller tokenizes only with deployments it may call (another tenant's private one is 404),
with the frontdoor's tokenizer, without a runner (a LoRA adapter: its base's).
`add_special_tokens` is honoured for a prompt; what ebb's tokenizer cannot do
(`continue_final_message`, no generation prompt, token strings, special tokens around a
rendered chat) is refused unless sent with vLLM's default.

Both are metered as chat is (`RateLimiter.reserve_count`): one request per call against
the caller's requests per minute, and its tokens against its tokens per minute — before
tokenizing, an estimate from the input's characters (one token per
`MAX_CHARS_PER_TOKEN`), settled to the count once tokenized; a call that fails keeps its
request and gives its tokens back. Inputs are bounded by the model's context before any
work: a prompt (or the text in messages and tools) of more than `MAX_CHARS_PER_TOKEN` ×
max_model_len characters, or more than max_model_len ids to detokenize, is a 400 (no
request with it could run). Tokenizing and detokenizing run in a worker thread.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from ebb.errors import InvalidRequest
from ebb.frontdoor.adapters import served_by_base
from ebb.frontdoor.auth import CallerDep
from ebb.frontdoor.body import decoded_json
from ebb.frontdoor.services import Services, ServicesDep
from ebb.frontdoor.version_routing import routed
from ebb.openai.schema import parse_body, parse_chat_request
from ebb.openai.tokenizer import PromptTokenizer
from ebb.openai.tool_prompt import plan_tools, template_messages
from ebb.queue.schema import DeploymentSpec

router = APIRouter()

# Characters per token of the longest text a model's context can hold, as a bound: few
# tokens of any tokenizer's vocabulary are longer, and text averages about 4.
MAX_CHARS_PER_TOKEN = 16


def _invalid(message: str, *, at: str) -> PydanticCustomError:
    # The error type ebb.openai.schema renders: `ebb_message` is the whole message.
    return PydanticCustomError("ebb_invalid", "{ebb_message}", {"ebb_message": message, "at": at})


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class TokenizeRequest(_Strict):
    model: str = Field(min_length=1)
    prompt: str | None = None
    # Checked as a chat request's (their errors name "messages.0.content" and so on).
    messages: list[dict[str, Any]] | None = Field(default=None, min_length=1)
    tools: list[dict[str, Any]] | None = None
    # vLLM's fields, accepted with the value ebb's tokenizer has (vLLM's default).
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    return_token_strs: bool | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if self.messages is not None and self.add_special_tokens:
            # The chat template holds the special tokens itself (vLLM's default: off).
            raise _invalid(
                "add_special_tokens=true is not supported with messages; leave it out",
                at="add_special_tokens",
            )
        if (self.prompt is None) == (self.messages is None):
            raise _invalid("send exactly one of prompt and messages", at="prompt")
        if self.tools and self.messages is None:
            raise _invalid("tools belong with messages; send messages, not prompt", at="tools")
        defaults = {
            "add_generation_prompt": True,
            "continue_final_message": False,
            "return_token_strs": False,
        }
        for name, default in defaults.items():
            value = getattr(self, name)
            if value is not None and value != default:
                raise _invalid(
                    f"{name}={str(value).lower()} is not supported here; leave it out "
                    f"(this server tokenizes as vLLM's default, {str(default).lower()})",
                    at=name,
                )
        return self


class DetokenizeRequest(_Strict):
    model: str = Field(min_length=1)
    tokens: list[int]


@router.post("/tokenize")
async def tokenize(request: Request, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    req = parse_body(TokenizeRequest, decoded_json(request))
    spec, tokenizer, max_model_len = await _model(services, caller, req.model)
    param = "prompt" if req.prompt is not None else "messages"
    chars = len(req.prompt) if req.prompt is not None else _text_chars([req.messages, req.tools])
    if chars > MAX_CHARS_PER_TOKEN * max_model_len:
        raise InvalidRequest(
            f"{param} holds {chars} characters, more than this model's context of "
            f"{max_model_len} tokens can hold (at most {MAX_CHARS_PER_TOKEN * max_model_len} "
            f"characters are tokenized here); shorten it.",
            param=param,
        )
    if req.prompt is not None:
        special = req.add_special_tokens is not False
        ids = await _counted(
            services, caller, chars, param, tokenizer.encode, req.prompt, add_special_tokens=special
        )
    else:
        ids = await _counted(services, caller, chars, param, _render_chat, req, tokenizer, spec)
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": None}


@router.post("/detokenize")
async def detokenize(request: Request, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    req = parse_body(DetokenizeRequest, decoded_json(request))
    _, tokenizer, max_model_len = await _model(services, caller, req.model)
    if len(req.tokens) > max_model_len:
        raise InvalidRequest(
            f"tokens holds {len(req.tokens)} ids, more than this model's context of "
            f"{max_model_len} tokens; send at most {max_model_len}.",
            param="tokens",
        )
    vocab_size = tokenizer.vocab_size
    outside = [i for i in req.tokens if not 0 <= i < vocab_size]
    if outside:
        raise InvalidRequest(
            f"tokens holds id {outside[0]}, outside this model's vocabulary (ids 0 to "
            f"{vocab_size - 1}); send ids from POST /tokenize.",
            param="tokens",
        )
    # Its count is known before any work: reserved exactly, nothing to settle.
    await services.limiter.reserve_count(caller, len(req.tokens), param="tokens")
    return {"prompt": await asyncio.to_thread(tokenizer.decode, req.tokens)}


async def _counted(
    services: Services,
    caller: Any,
    chars: int,
    param: str,
    count: Callable[..., list[int]],
    *args: Any,
    **kwargs: Any,
) -> list[int]:
    """`count(*args, **kwargs)` in a worker thread, metered: one request and the
    characters' estimate reserved first (429 before any work), settled to the ids'."""
    estimate = max(1, math.ceil(chars / MAX_CHARS_PER_TOKEN))
    charge = await services.limiter.reserve_count(caller, estimate, param=param)
    ids: list[int] | None = None
    try:
        ids = await asyncio.to_thread(count, *args, **kwargs)
        return ids
    finally:
        await asyncio.shield(charge.settle(len(ids) if ids is not None else None))


def _text_chars(value: object) -> int:
    """The characters in the strings (keys too) of decoded JSON (bounded in depth)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(k) + _text_chars(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    return 0


async def _model(
    services: Services, caller: Any, model: str
) -> tuple[DeploymentSpec, PromptTokenizer, int]:
    """The deployment a request for `model` would run on (404 as chat gives it) and its
    tokenizer and context length, once its weights are ready (an adapter's: its base's,
    whose tokenizer and chat template its requests are rendered with)."""
    named = await routed(services.state, caller, model)
    route, _ = await served_by_base(services.state, caller, named)
    spec = route.spec
    window_s = spec.admission_timeout_s or services.settings.admission_timeout_s
    info = await services.catalog.info(spec, wait_s=window_s)
    return spec, info.tokenizer, info.max_model_len


def _render_chat(
    req: TokenizeRequest, tokenizer: PromptTokenizer, spec: DeploymentSpec
) -> list[int]:
    """The ids a chat request with these messages and tools sends (as prepare_chat renders)."""
    body: dict[str, Any] = {"model": req.model, "messages": req.messages}
    if req.tools:
        body["tools"] = req.tools
    chat = parse_chat_request(body)
    serving = spec.serving
    template = tokenizer.chat_template_text(serving.chat_template)
    plan = plan_tools(chat, template, serving)
    messages, tools = template_messages(chat, template, plan)
    return tokenizer.render_chat(messages, tools, serving.chat_template)
