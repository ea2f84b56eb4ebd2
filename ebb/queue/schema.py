"""Typed messages that cross process boundaries through Redis (msgspec, never pickle).

The frontdoor writes a `WorkItem` into a deployment's queue; the runner that claims it
answers on the request's output stream with `RequestEvent`s: `Claimed`, then `Progress`
deltas, then exactly one terminal event, `Finished` or `Failed`. A request whose runner
was lost goes on as a continuation: `Continued`, then `Claimed` and `Progress` again from
the next token.
"""

from __future__ import annotations

import enum
import secrets
from typing import Any, Literal

import msgspec

from ebb.queue.scaling_spec import ScalingSpec


class SamplingSpec(msgspec.Struct, kw_only=True, frozen=True):
    """Engine-neutral sampling parameters, already validated by the frontdoor."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: list[str] = []
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # None: no logprobs. k >= 0: the sampled token's logprob plus the k most likely ones.
    logprobs: int | None = None
    # Structured output: a JSON schema, or any JSON object when json_object is set.
    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    # Structured output once triggered (JSON text of xgrammar's structural tag): strict
    # functions' arguments in a reply that may also be text.
    structural_tag: str | None = None
    # vLLM's extra sampling parameters (see ebb.openai.sampling_extras); the defaults are
    # vLLM's, so older messages without them mean what they meant before.
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    stop_token_ids: list[int] = []
    allowed_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] = {}
    # An embedding request (a deployment whose engine runs as a pooling model): the engine
    # returns the prompt's embedding instead of generating; `dimensions` truncates it
    # (models trained for that only).
    embed: bool = False
    dimensions: int | None = None
    # An embeddings job's inputs travel concatenated in prompt_token_ids: each one's
    # length, in order (empty: the prompt is one input). The runner embeds each on its own
    # and answers with choice i for input i (see ebb.runners.embedding_inputs).
    embed_input_lengths: list[int] = []


ToolMode = Literal["auto", "required", "named"]


class ToolCallFormat(msgspec.Struct, kw_only=True, frozen=True):
    """How a chat reply's text becomes OpenAI tool calls (see ebb.openai.tool_calls).

    auto: the model may call tools in `parser`'s syntax (hermes, llama3_json, mistral);
    required: the text is a JSON array of {"name", "parameters"} (guided decoding);
    named: the text is the arguments of `function` (guided decoding).
    """

    mode: ToolMode
    parser: str = "hermes"
    function: str = ""
    parallel: bool = True


class AdapterRef(msgspec.Struct, kw_only=True, frozen=True):
    """The adapter a work item runs with: its deployment (`name`, a unit name, billed
    under its public name), identity and source, fetched through the runner's weight
    cache."""

    name: str
    uid: str
    source: str


class WorkItem(msgspec.Struct, kw_only=True, frozen=True):
    request_id: str
    deployment: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec
    tenant: str = "admin"
    enqueued_at_s: float = 0.0
    # Set for an async job's attempt: its result is collected by the webhooks worker.
    job_id: str = ""
    # Billing: the key that sent it and the token prices in force when it was admitted.
    key_id: str = ""
    price_per_1m_input_tokens_micros: int = 0
    price_per_1m_output_tokens_micros: int = 0
    # W3C trace context of the frontdoor's span for this request, when tracing is on: the
    # runner's spans join the client's trace under it.
    traceparent: str = ""
    # The identity (DeploymentSpec.uid) of the deployment it was admitted for: a runner of
    # another deployment of the same name refuses it ("": not stamped, any runner).
    deployment_uid: str = ""
    # Its priority class (ebb.queue.priority): its key's, else its tenant's. It orders
    # claims and the engine's own scheduler where it has one.
    priority: str = "standard"
    # A request for a LoRA adapter deployment: queued for its base's runners (`deployment`
    # is the base's unit), which run it with this adapter. None: the base model itself.
    adapter: AdapterRef | None = None


class TopLogprob(msgspec.Struct, frozen=True):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(msgspec.Struct, frozen=True):
    token: str
    logprob: float
    bytes: list[int]
    top: list[TopLogprob] = []


FinishReason = Literal["stop", "length"]


class ChoiceDelta(msgspec.Struct, kw_only=True, frozen=True):
    """New output of one choice since the previous delta."""

    index: int
    text: str
    token_count: int
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    # An embedding request's result (its only delta), normalized as the model pools it.
    embedding: list[float] | None = None
    # The ids of this delta's tokens (one per counted token): what a continuation on
    # another runner replays after the prompt (see ebb.queue.continuation).
    token_ids: list[int] = []


class Claimed(msgspec.Struct, tag="claimed", frozen=True):
    runner_id: str


class Progress(msgspec.Struct, tag="progress", frozen=True):
    choices: list[ChoiceDelta]
    # 1, 2, ... per attempt (restarting after each Claimed): a runner that retries a write
    # whose reply a Redis restart swallowed may publish one twice; readers drop repeats.
    # 0: unnumbered.
    seq: int = 0
    # The continuation that wrote it (0: the first run; see Continued): a reader drops
    # output of an earlier one, late writes of a runner already declared lost.
    attempt: int = 0


class Continued(msgspec.Struct, tag="continued", frozen=True):
    """The request lost its runner (or was given back) and is queued again as its
    `attempt`-th continuation: the next runner replays the output so far and goes on."""

    attempt: int


class Finished(msgspec.Struct, tag="finished", frozen=True):
    prompt_tokens: int
    completion_tokens: int


class Failed(msgspec.Struct, tag="failed", frozen=True):
    message: str
    # One of ebb.errors' codes, e.g. "runner_lost", "engine_error", "cancelled".
    code: str
    retryable: bool = False


RequestEvent = Claimed | Progress | Continued | Finished | Failed

_event_decoder = msgspec.json.Decoder(RequestEvent)
_work_decoder = msgspec.json.Decoder(WorkItem)
_encoder = msgspec.json.Encoder()


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode_event(data: bytes) -> RequestEvent:
    return _event_decoder.decode(data)


def decode_work(data: bytes) -> WorkItem:
    return _work_decoder.decode(data)


# --- platform records kept in Redis ------------------------------------------------------


class EngineSpec(msgspec.Struct, kw_only=True, frozen=True):
    """A deployment's engine options, passed to vLLM; None leaves the platform's choice.

    Validated at deploy time by `ebb.engine_options.check_engine` (a 400 that says what to
    change); `gpu_memory_gib` replaces placement's estimate of the runner's need.
    """

    dtype: str | None = None
    quantization: str | None = None
    max_num_seqs: int | None = None  # None: priority.engine_batch_limit
    tensor_parallel_size: int | None = None  # None: 1, or what placement needs to fit
    enable_prefix_caching: bool | None = None
    gpu_memory_gib: float | None = None
    enforce_eager: bool | None = None  # None: eager on CPU, CUDA graphs on GPUs
    # On a cluster: the GPU model its runner pods need (a node label's value, e.g.
    # "NVIDIA-A100-SXM4-80GB" for nvidia.com/gpu.product); None: any node with GPUs.
    accelerator: str | None = None
    # On a cluster: a runner pod's host memory; None: sized from the model's weights.
    host_memory_gib: float | None = None
    # LoRA: the engine serves adapter deployments that name this one as their base.
    # None: off, and the limits below take ebb.runners.adapters' defaults when it is on.
    enable_lora: bool | None = None
    max_loras: int | None = None  # adapters in one batch (resident on the device)
    max_lora_rank: int | None = None  # the highest adapter rank it accepts
    max_cpu_loras: int | None = None  # adapters kept loaded in host memory (LRU)


# serving.default_max_tokens unless a deployment sets its own.
DEFAULT_MAX_TOKENS = 2048
# serving.max_request_s unless a deployment sets its own.
DEFAULT_MAX_REQUEST_S = 600.0


class ServingOptions(msgspec.Struct, kw_only=True, frozen=True):
    """How a deployment's model meets the OpenAI API (beyond the engine's own options)."""

    # "" picks the parser from the model's chat template (hermes when it does not say);
    # "none" turns tool calling off for this deployment.
    tool_parser: str = ""
    # A Jinja chat template used instead of the model's own ("" keeps the model's).
    chat_template: str = ""
    # "embed": the engine runs the weights as a pooling (embedding) model, serving only
    # /v1/embeddings; "generate": chat and completions.
    task: Literal["generate", "embed"] = "generate"
    # The Batch API's price: token prices less this percentage (0 to 100).
    batch_discount_pct: int = 0
    # Output tokens of a chat (or Responses) request that names no max_tokens: a runaway
    # generation ends here, not when the context is full (completions keep OpenAI's 16).
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    # The most output tokens one request may ask for (a 400 above it); 0: only the
    # context left limits it.
    max_tokens_limit: int = 0
    # Seconds a request may run from its arrival before it is stopped in the engine (its
    # answer a 504, its stream's end an error event); 0: no limit but max_tokens.
    max_request_s: float = DEFAULT_MAX_REQUEST_S


def new_deployment_uid() -> str:
    """A deployment's identity, drawn once when it is created (`DeploymentSpec.uid`)."""
    return "dep_" + secrets.token_hex(8)


class DeploymentSpec(msgspec.Struct, kw_only=True):
    """What an operator asked for; runtime state (runners, queue) is derived, not stored."""

    name: str
    source: str
    # Its identity: set once at creation, kept by every change and version. A name is
    # reused after a delete; a uid never is, and runners, sleepers and logs are bound to
    # it (see docs/ARCHITECTURE.md). "" for records written before uids: such a
    # deployment is its own identity until it is deleted.
    uid: str = ""
    min_replicas: int = 0
    max_replicas: int = 1
    idle_timeout_s: float = 60.0
    # Requests one runner feeds into its engine's continuous batch at once.
    max_concurrency: int = 32
    # None: the platform default (EBB_QUEUE_DEPTH_LIMIT / EBB_ADMISSION_TIMEOUT_S).
    queue_depth_limit: int | None = None
    admission_timeout_s: float | None = None
    # None: the model's own context length.
    max_model_len: int | None = None
    created_at_s: float = 0.0
    # Billing: the tenant billed for the deployment's GPU time, and its prices in integer
    # micro-units of currency (1_000_000 = 1.00).
    owner: str = "admin"
    price_per_1m_input_tokens_micros: int = 0
    price_per_1m_output_tokens_micros: int = 0
    price_per_gpu_second_micros: int = 0
    # Who may see and call it besides its owner and the admin: "public" every tenant (what
    # admin-created deployments are, and every record written before this field existed),
    # "private" only the tenants in `shared_with` (what tenant-created deployments are).
    visibility: Literal["public", "private"] = "public"
    shared_with: list[str] = []
    # Its priority class (ebb.queue.priority): placement never puts runners of different
    # classes on one GPU, and its waiting work's class orders cold starts.
    priority: str = "standard"
    engine: EngineSpec = msgspec.field(default_factory=EngineSpec)
    serving: ServingOptions = msgspec.field(default_factory=ServingOptions)
    scaling: ScalingSpec = msgspec.field(default_factory=ScalingSpec)
    # A LoRA adapter deployment: `source` is a PEFT adapter served by the runners of the
    # deployment named `base` (of identity `base_uid`, bound at creation); it has no
    # runners, queue or weights preparation of its own. "": a model of its own.
    base: str = ""
    base_uid: str = ""
    # An adapter whose token prices (or Batch API discount) the admin set: its requests
    # pay exactly those. False: never less than its base's (`ebb.frontdoor.adapter_prices`).
    prices_set_by_admin: bool = False


class RunnerState(enum.StrEnum):
    STARTING = "starting"  # process launched, importing libraries
    PREWARMED = "prewarmed"  # libraries imported, no model, waiting for an assignment
    LOADING = "loading"  # assigned: fetching weights, building the engine
    READY = "ready"  # claiming and serving
    DRAINING = "draining"  # no more claims; finishing what it holds
    SLEEPING = "sleeping"  # idle with its engine asleep (GPU sleep mode); wakes in seconds
    EXITED = "exited"
    FAILED = "failed"

    @property
    def is_live(self) -> bool:
        return self not in (RunnerState.EXITED, RunnerState.FAILED)

    @property
    def will_serve(self) -> bool:
        """Counts toward a deployment's capacity now or soon (not draining or gone)."""
        return self in (RunnerState.STARTING, RunnerState.LOADING, RunnerState.READY)


class RunnerRecord(msgspec.Struct, kw_only=True):
    runner_id: str
    state: RunnerState
    deployment: str = ""  # "" while a pre-warmed stem has no assignment
    # The uid of the deployment it was launched for or assigned to: it serves that
    # deployment only, never a later one of the same name.
    deployment_uid: str = ""
    pid: int = 0
    tier: str = ""  # the cold-start tier it came up through
    launched_ms: int = 0
    ready_ms: int = 0
    heartbeat_ms: int = 0
    exited_ms: int = 0
    error: str = ""
    # When the controller last woke this runner from sleep; after its last ready_ms, the
    # runner is waking up and already counts as capacity on its way.
    woken_ms: int = 0
    # When the controller last gave it a deployment (a stem taken from the pool, a sleeper
    # woken); 0 for a runner launched with its deployment.
    assigned_ms: int = 0
    # The node it runs on, as the runner reports it (EBB_NODE_NAME, else its host name).
    node: str = ""
    # The stem pool it was launched into ("" the default pool, or launched for a deployment).
    pool: str = ""
    # Its engine's progress as of its last heartbeat: steps made since it loaded, and how
    # long the engine call in progress had run (0: none). A step that does not end is a
    # stalled engine (EBB_ENGINE_STALL_S); the runner's own watchdog acts on it.
    engine_steps: int = 0
    engine_busy_ms: int = 0

    @property
    def is_starting(self) -> bool:
        """On its way to serving: launched, assigned, loading, or being woken."""
        if self.state is RunnerState.SLEEPING:
            return self.woken_ms > self.ready_ms
        return self.state in (RunnerState.STARTING, RunnerState.PREWARMED, RunnerState.LOADING)


class ApiKeyRecord(msgspec.Struct, kw_only=True):
    key_id: str  # public prefix shown in listings, e.g. "ebb-sk-ab12"
    tenant: str
    name: str = ""
    created_at_s: float = 0.0
    revoked: bool = False
    # The first characters of the secret, shown in listings so a key's holder can find it.
    prefix: str = ""


class UsageRecord(msgspec.Struct, kw_only=True):
    request_id: str
    deployment: str
    tenant: str
    prompt_tokens: int
    completion_tokens: int
    state: str  # finished | cancelled | failed
    runner_id: str
    finished_at_s: float
    key_id: str = ""
    price_per_1m_input_tokens_micros: int = 0
    price_per_1m_output_tokens_micros: int = 0
    # The deployment's version that served it (1 for deployments made before versions).
    version: int = 1
    # From enqueue to the first output, as the runner saw it; None: no output (failed
    # before any, an embedding). Rollouts compare versions by it.
    ttft_ms: float | None = None
    # Per output token after the first, as the runner saw it (scaling policies' p90).
    tpot_ms: float | None = None
    # From enqueue to its claim (part of `ttft_ms`), and the mean number of requests in
    # its runner's batch while it decoded: the online latency model's inputs.
    queue_ms: float | None = None
    batch_size: float | None = None
    # An adapter's request (`deployment` is the adapter, billed at its prices): the base
    # deployment whose runner served it ("" for a model's own request).
    base: str = ""


class ColdStartRecord(msgspec.Struct, kw_only=True):
    deployment: str
    tier: str
    phases_ms: dict[str, float]
