"""From the OpenAI HTTP API to ebb's queue messages.

`prepare_chat` / `prepare_completion` turn a validated request into the prompt's token ids
and an engine-neutral `SamplingSpec`, refusing with InvalidRequest (400) what the deployed
model cannot do. The way back (queue events to OpenAI's response objects) is
`ebb.openai.response_builder`, shared with the jobs collector. Nothing here does I/O; the routes
own HTTP, the queue and admission.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ebb.errors import InvalidRequest
from ebb.openai.response_builder import EndpointKind, ResponseBuilder
from ebb.openai.schema import ChatCompletionRequest, CompletionRequest
from ebb.openai.tokenizer import PromptTokenizer
from ebb.openai.tool_prompt import ToolPlan, plan_tools, template_messages
from ebb.queue.schema import DeploymentSpec, SamplingSpec, ServingOptions, ToolCallFormat
from ebb.queue.stream_views import StreamView

# OpenAI's documented default for the legacy completions endpoint; chat defaults to the
# rest of the context instead.
COMPLETION_DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class Prepared:
    """A request ready for the queue, plus what the response needs to know about it.

    `logprobs` says whether choices carry logprobs; their format follows `kind`; `tools`
    says how a chat reply's text becomes tool calls (None: it is plain content).
    """

    kind: EndpointKind
    model: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec
    stream: bool
    include_usage: bool
    logprobs: bool
    tools: ToolCallFormat | None = None
    continuous_usage: bool = False

    def builder(self, request_id: str, created_s: int) -> ResponseBuilder:
        return ResponseBuilder(
            self.kind,
            request_id=request_id,
            model=self.model,
            created_s=created_s,
            n=self.sampling.n,
            include_usage=self.include_usage,
            continuous_usage_prompt_tokens=(
                len(self.prompt_token_ids) if self.continuous_usage else None
            ),
            logprobs=self.logprobs,
            tools=self.tools,
        )

    def stream_view(
        self, tenant: str, created_s: int, response: dict[str, Any] | None = None
    ) -> StreamView:
        """What `builder` renders with, kept so that any frontdoor can replay the stream
        (`response`: a Responses API stream's Response object as created)."""
        return StreamView(
            tenant=tenant,
            kind=self.kind.value,
            model=self.model,
            created_s=created_s,
            n=self.sampling.n,
            include_usage=self.include_usage,
            continuous_usage_prompt_tokens=(
                len(self.prompt_token_ids) if self.continuous_usage else None
            ),
            logprobs=self.logprobs,
            tools=self.tools,
            response=response,
        )


def prepare_chat(
    req: ChatCompletionRequest,
    tokenizer: PromptTokenizer,
    *,
    max_model_len: int,
    max_n: int,
    serving: ServingOptions | None = None,
) -> Prepared:
    """Render the conversation with the model's chat template and size the completion.

    `serving` holds the deployment's tool parser and chat template (defaults if None).
    """
    _check_n(req.n, max_n, req.temperature)
    serving = serving or ServingOptions()
    template = tokenizer.chat_template_text(serving.chat_template)
    plan = plan_tools(req, template, serving)
    messages, tools = template_messages(req, template, plan)
    prompt_ids = tokenizer.render_chat(messages, tools, serving.chat_template)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return _prepare(
        EndpointKind.CHAT,
        req,
        prompt_ids,
        "messages",
        logprobs,
        max_model_len=max_model_len,
        vocab_size=tokenizer.vocab_size,
        plan=plan,
        serving=serving,
    )


def prepare_completion(
    req: CompletionRequest,
    tokenizer: PromptTokenizer,
    *,
    max_model_len: int,
    max_n: int,
    serving: ServingOptions | None = None,
) -> Prepared:
    """Tokenize the prompt as-is and size the completion."""
    _check_n(req.n, max_n, req.temperature)
    serving = serving or ServingOptions()
    prompt_ids = tokenizer.encode(req.prompt)
    if not prompt_ids:
        raise InvalidRequest("prompt is empty; send at least one character.", param="prompt")
    kind = EndpointKind.COMPLETION
    return _prepare(
        kind,
        req,
        prompt_ids,
        "prompt",
        req.logprobs,
        max_model_len=max_model_len,
        vocab_size=tokenizer.vocab_size,
        serving=serving,
    )


def require_generative(spec: DeploymentSpec) -> None:
    """Chat and completions need a generative deployment, not an embedding one."""
    if spec.serving.task == "embed":
        raise InvalidRequest(
            f"The model {spec.name!r} is an embedding deployment; it serves only "
            "POST /v1/embeddings.",
            param="model",
        )


def _check_n(n: int | None, max_n: int, temperature: float | None) -> None:
    if n is not None and n > max_n:
        raise InvalidRequest(
            f"n must be at most {max_n} on this server; got {n}. Ask for fewer choices.",
            param="n",
        )
    if n is not None and n > 1 and temperature == 0:
        # Greedy sampling would return n identical choices; vLLM refuses it too.
        raise InvalidRequest(
            f"n={n} needs a temperature above 0: greedy sampling gives identical choices. "
            "Raise the temperature or set n to 1.",
            param="n",
        )


def _prepare(
    kind: EndpointKind,
    req: ChatCompletionRequest | CompletionRequest,
    prompt_ids: list[int],
    prompt_param: str,
    logprobs: int | None,
    *,
    max_model_len: int,
    vocab_size: int,
    serving: ServingOptions,
    plan: ToolPlan | None = None,
) -> Prepared:
    max_tokens = _max_tokens(kind, req, len(prompt_ids), prompt_param, max_model_len, serving)
    _check_extras(req, max_tokens, vocab_size)
    fmt = req.response_format
    plan = plan or ToolPlan(None)
    extras = _extras(req)
    if plan.skip_special_tokens is not None:
        extras.setdefault("skip_special_tokens", plan.skip_special_tokens)
    sampling = SamplingSpec(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        n=req.n or 1,
        stop=list(req.stop or []),
        seed=req.seed,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logprobs=logprobs,
        json_schema=plan.json_schema
        or (fmt.json_schema.schema_ if fmt and fmt.json_schema else None),
        json_object=fmt is not None and fmt.type == "json_object",
        structural_tag=plan.structural_tag,
        **extras,
    )
    return Prepared(
        kind=kind,
        model=req.model,
        prompt_token_ids=prompt_ids,
        sampling=sampling,
        stream=bool(req.stream),
        include_usage=req.include_usage,
        continuous_usage=req.continuous_usage,
        logprobs=logprobs is not None,
        tools=plan.fmt,
    )


def _max_tokens(
    kind: EndpointKind,
    req: ChatCompletionRequest | CompletionRequest,
    prompt_len: int,
    prompt_param: str,
    max_model_len: int,
    serving: ServingOptions,
) -> int:
    """The request's output cap: what it asks for (within the context left and the
    deployment's serving.max_tokens_limit), else the deployment's default."""
    room = max_model_len - prompt_len
    if room < 1:
        raise InvalidRequest(
            f"This model's maximum context length is {max_model_len} tokens; your prompt has "
            f"{prompt_len} tokens. Shorten the prompt to at most {max_model_len - 1} tokens "
            "so that at least one token can be generated.",
            param=prompt_param,
        )
    requested, param = req.max_tokens_param
    limit = serving.max_tokens_limit or room
    if requested is None:
        default = serving.default_max_tokens
        if kind is EndpointKind.COMPLETION:
            default = COMPLETION_DEFAULT_MAX_TOKENS
        return min(room, limit, default)
    if requested > serving.max_tokens_limit > 0:
        raise InvalidRequest(
            f"{param} asks for {requested} tokens; this deployment serves at most "
            f"{serving.max_tokens_limit} output tokens per request "
            f"(serving.max_tokens_limit). Set {param} to at most {serving.max_tokens_limit}.",
            param=param,
        )
    if requested > room:
        raise InvalidRequest(
            f"This model's maximum context length is {max_model_len} tokens; your prompt has "
            f"{prompt_len} tokens and {param} asks for {requested} more "
            f"({prompt_len + requested} in total). Set {param} to at most {room}, "
            "or shorten the prompt.",
            param=param,
        )
    return requested


def _check_extras(
    req: ChatCompletionRequest | CompletionRequest, max_tokens: int, vocab_size: int
) -> None:
    """The extras' checks that need the model: ids in its vocabulary, a reachable minimum."""
    for param, ids in req.token_ids_named().items():
        outside = [i for i in ids if i >= vocab_size]
        if outside:
            raise InvalidRequest(
                f"{param} names token id {outside[0]}, outside this model's vocabulary "
                f"(ids 0 to {vocab_size - 1}); use ids from the model's tokenizer.",
                param=param,
            )
    if req.min_tokens is not None and req.min_tokens > max_tokens:
        _, name = req.max_tokens_param
        raise InvalidRequest(
            f"min_tokens ({req.min_tokens}) is more than the completion may have "
            f"({max_tokens}, from {name} or the context left); lower min_tokens.",
            param="min_tokens",
        )


def _extras(req: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    """SamplingSpec's vLLM extras; absent fields keep the spec's (vLLM's) defaults."""
    fields: dict[str, Any] = {
        "top_k": None if req.top_k is None else max(req.top_k, 0),
        "min_p": req.min_p,
        "repetition_penalty": req.repetition_penalty,
        "min_tokens": req.min_tokens,
        "stop_token_ids": req.stop_token_ids,
        "allowed_token_ids": req.allowed_token_ids,
        "ignore_eos": req.ignore_eos,
        "skip_special_tokens": req.skip_special_tokens,
        "spaces_between_special_tokens": req.spaces_between_special_tokens,
        "include_stop_str_in_output": req.include_stop_str_in_output,
    }
    if req.logit_bias:
        fields["logit_bias"] = {int(k): v for k, v in req.logit_bias.items()}
    return {name: value for name, value in fields.items() if value is not None}
