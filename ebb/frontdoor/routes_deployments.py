"""Deployments: create, list, inspect, scale and delete (the admin, or a tenant its own:
see `ebb.frontdoor.tenancy`)."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, Literal

import msgspec
from fastapi import APIRouter, Header
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from ebb.engine_options import DTYPES, GpuCapacity, check_engine
from ebb.engines import EngineRegistry
from ebb.errors import Conflict, InvalidRequest, NotFound
from ebb.frontdoor import adapters, tenancy
from ebb.frontdoor.adapter_prices import priced_by_admin
from ebb.frontdoor.auth import CallerDep
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.deploy_versions import (
    deploy_version,
    keep_first_env,
    refuse_version_fields,
    seal_env,
    version_summary,
)
from ebb.frontdoor.quotas import check_source
from ebb.frontdoor.routes_limits import TENANT_PATTERN
from ebb.frontdoor.routes_scaling import ScalingBody
from ebb.frontdoor.services import Services, ServicesDep
from ebb.frontdoor.version_quotas import check_version_quota, versions_limit, versions_refusal
from ebb.openai.chat_template import MAX_TEMPLATE_CHARS, compile_template
from ebb.queue.gpus import GpuState
from ebb.queue.platform import PlatformState
from ebb.queue.priority import Priority
from ebb.queue.schema import (
    DeploymentSpec,
    EngineSpec,
    RunnerState,
    ServingOptions,
    new_deployment_uid,
)
from ebb.queue.version_store import TooManyVersions
from ebb.queue.versions import public_name, split_unit
from ebb.queue.weights_status import WeightsState, WeightsStatus
from ebb.weights_cache.sources import normalize_source

router = APIRouter(prefix="/v1/deployments")

# 1,000,000.00 per unit: far above any real price, far below overflowing a 64-bit sum.
MAX_PRICE_MICROS = 10**12
# Last log lines per runner in GET /v1/deployments/{name} (the console's detail view).
RUNNER_LOG_TAIL_LINES = 20
MAX_SOURCE_CHARS = 2048

DeploymentName = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$"),
]


class ServingBody(BaseModel):
    """DeploymentSpec.serving: how the model meets the OpenAI API (absent: unchanged)."""

    model_config = ConfigDict(extra="forbid")

    tool_parser: Literal["", "none", "hermes", "llama3_json", "mistral"] | None = Field(
        None, description="How replies become tool calls; empty: from the chat template."
    )
    chat_template: str | None = Field(
        None,
        max_length=MAX_TEMPLATE_CHARS,
        description="A Jinja chat template instead of the model's (compiled when deployed).",
    )
    task: Literal["generate", "embed"] | None = Field(
        None, description="embed: run the weights as an embedding (pooling) model."
    )
    batch_discount_pct: int | None = Field(
        None, ge=0, le=100, description="Batch API token prices: this much percent off."
    )
    default_max_tokens: int | None = Field(
        None, ge=1, le=10_000_000, description="Output tokens of a request naming no max_tokens."
    )
    max_tokens_limit: int | None = Field(
        None, ge=0, le=10_000_000, description="Most output tokens a request may ask; 0: no cap."
    )
    max_request_s: float | None = Field(
        None, ge=0, le=86_400, description="Seconds a request may run before it is stopped."
    )


class EngineBody(BaseModel):
    """Engine options (`EngineSpec`); each omitted one keeps the platform's choice."""

    model_config = ConfigDict(extra="forbid")

    dtype: str | None = Field(None, description=f"One of {', '.join(DTYPES)}.")
    quantization: str | None = Field(None, description="A vLLM quantization method.")
    max_num_seqs: int | None = Field(None, ge=1, le=4096)
    tensor_parallel_size: int | None = Field(None, ge=1, le=8)
    enable_prefix_caching: bool | None = None
    gpu_memory_gib: float | None = Field(
        None, gt=0, le=4096, description="The runner's GPU memory, instead of the estimate."
    )
    enforce_eager: bool | None = None
    # LoRA: serve adapter deployments on this one (see ebb.frontdoor.adapters).
    enable_lora: bool | None = Field(None, description="Serve LoRA adapter deployments.")
    max_loras: int | None = Field(None, ge=1, le=256, description="Adapters in one batch.")
    max_lora_rank: int | None = Field(None, ge=1, le=512, description="Highest adapter rank.")
    max_cpu_loras: int | None = Field(
        None, ge=1, le=4096, description="Adapters kept loaded in host memory (LRU)."
    )


class DeploymentPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_replicas: int | None = Field(None, ge=0, le=64)
    max_replicas: int | None = Field(None, ge=1, le=64)
    idle_timeout_s: float | None = Field(None, gt=0, le=86400)
    max_concurrency: int | None = Field(None, ge=1, le=1024)
    queue_depth_limit: int | None = Field(None, ge=1, le=100_000)
    admission_timeout_s: float | None = Field(None, gt=0, le=600)
    max_model_len: int | None = Field(None, ge=16)
    # Billing: the tenant billed for the GPU time, and prices in micros (1_000_000 = 1.00).
    owner: str | None = Field(
        None, pattern=TENANT_PATTERN, description="The tenant billed for its GPU time."
    )
    price_per_1m_input_tokens_micros: int | None = Field(
        None, ge=0, le=MAX_PRICE_MICROS, description="What a caller pays per 1M prompt tokens."
    )
    price_per_1m_output_tokens_micros: int | None = Field(
        None, ge=0, le=MAX_PRICE_MICROS, description="What a caller pays per 1M output tokens."
    )
    price_per_gpu_second_micros: int | None = Field(
        None, ge=0, le=MAX_PRICE_MICROS, description="What the owner pays per GPU-second."
    )
    # Who besides its owner may see and call it (the admin's to set; see tenancy).
    visibility: Literal["public", "private"] | None = Field(
        None, description="public: every tenant; private: its owner and shared_with."
    )
    shared_with: list[Annotated[str, StringConstraints(pattern=TENANT_PATTERN)]] | None = Field(
        None, max_length=256, description="Tenants that may call a private deployment."
    )
    # The admin's to set (see tenancy): deployments of different classes never share a GPU.
    priority: Priority | None = Field(
        None, description="critical, standard or sheddable: never shares a GPU with another."
    )
    serving: ServingBody | None = None
    engine: EngineBody | None = None
    scaling: ScalingBody | None = None

    def changes(self, engine: EngineSpec, serving: ServingOptions) -> dict[str, Any]:
        """The fields given, `engine` and `serving` merged over the current options."""
        fields = self.model_dump(exclude_none=True, exclude={"engine", "serving", "env", "scaling"})
        if self.scaling is not None:
            fields["scaling"] = self.scaling.spec()
        if self.engine is not None:
            given = self.engine.model_dump(exclude_none=True)
            fields["engine"] = msgspec.structs.replace(engine, **given)
        if self.serving is not None:
            given = self.serving.model_dump(exclude_none=True)
            fields["serving"] = msgspec.structs.replace(serving, **given)
        return fields


class DeploymentCreate(DeploymentPatch):
    name: DeploymentName = Field(
        description="lowercase letters, digits, '.', '_' or '-'; at most 63 characters"
    )
    # Served back in listings: bounded like a URL.
    source: str = Field(min_length=1, max_length=MAX_SOURCE_CHARS)
    base: DeploymentName | None = Field(
        None,
        description="A LoRA adapter deployment: the deployment whose runners serve it; "
        "source is then the adapter's directory (peft's save_pretrained).",
    )
    env: dict[str, str] | None = Field(
        None,
        description="The version's environment (secrets such as HF_TOKEN), stored encrypted; "
        "only the names are ever shown. Absent on a new version: the latest version's.",
    )

    @model_validator(mode="after")
    def _defaults(self) -> DeploymentCreate:
        self.min_replicas = 0 if self.min_replicas is None else self.min_replicas
        self.max_replicas = 1 if self.max_replicas is None else self.max_replicas
        return self


def _check_bounds(spec: DeploymentSpec) -> None:
    if spec.min_replicas > spec.max_replicas:
        raise InvalidRequest(
            f"min_replicas ({spec.min_replicas}) must not exceed max_replicas "
            f"({spec.max_replicas}).",
            param="min_replicas",
        )
    scheduled = max((e.min_replicas for e in spec.scaling.schedule), default=0)
    if scheduled > spec.max_replicas:
        raise InvalidRequest(
            f"scaling.schedule asks for {scheduled} replicas, more than max_replicas "
            f"({spec.max_replicas}).",
            param="scaling.schedule",
        )


async def _check_template(body: DeploymentPatch) -> None:
    """A deployment's own chat template compiles (off the loop: a long one takes a while),
    or the deploy is a 400 naming serving.chat_template and the line at fault."""
    source = body.serving.chat_template if body.serving is not None else None
    if source:
        await asyncio.to_thread(compile_template, source)


def _checked_source(engines: EngineRegistry, caller: Caller, source: str) -> str:
    """The source to store, once valid (else InvalidRequest naming the accepted forms): a
    tenant's normalized, so that what its allowed prefixes are checked against is what is
    stored and read."""
    engines.validate(source)
    return source if caller.is_admin else normalize_source(source)


async def _check_engine(state: PlatformState, spec: DeploymentSpec) -> None:
    capacity = GpuCapacity.of(await GpuState(state.redis).inventories())
    check_engine(spec.engine, max_concurrency=spec.max_concurrency, capacity=capacity)


async def deployment_view(state: PlatformState, spec: DeploymentSpec) -> dict[str, Any]:
    # Every version's runners (a version's serving unit is "NAME@vN"), of this deployment
    # only: not those of an earlier one of the same name, deleted (their logs, errors).
    runners = [
        r
        for r in await state.runners()
        if public_name(r.deployment) == spec.name and r.deployment_uid == spec.uid
    ]
    counts = {s.value: 0 for s in RunnerState if s.is_live}
    for r in runners:
        if r.state.is_live:
            counts[r.state.value] += 1
    status = await state.deployment_status(spec.name)
    queue = await state.queue_snapshot(spec.name)
    return {
        "object": "deployment",
        **msgspec.to_builtins(spec),
        **await version_summary(state, spec),
        "status": _summary(counts, status),
        "replicas": counts,
        "queue_depth": queue.depth,
        "job_queue_depth": queue.job_depth,
        "oldest_wait_s": round(queue.oldest_wait_s, 3),
        "weights": status.get("weights", "unknown"),
        "weights_progress": _weights_progress(status),
        "error": status.get("error")
        or status.get("unschedulable")
        or status.get("weights_error")
        or None,
        "error_log": status.get("error_log") or None,
        "cold_start_ms": await state.cold_start_ms(spec.name),
        "runners": [
            {
                "id": r.runner_id,
                "version": split_unit(r.deployment)[1],
                "state": r.state.value,
                "tier": r.tier,
                "pid": r.pid,
                "launched_ms": r.launched_ms,
                "ready_ms": r.ready_ms,
                "error": r.error or None,
            }
            for r in runners
        ],
    }


def _weights_progress(status: dict[str, str]) -> dict[str, Any] | None:
    """While weights are prepared: the phase (download, convert, hash, verify, publish,
    tokenizer) and the fraction of it done."""
    if status.get("weights") != "preparing":
        return None
    try:
        fraction = float(status.get("weights_progress") or 0)
    except ValueError:
        fraction = 0.0
    return {"phase": status.get("weights_phase") or "starting", "fraction": fraction}


def _summary(counts: dict[str, int], status: dict[str, str]) -> str:
    if status.get("error") or status.get("weights") == "failed":
        return "failing"
    if status.get("unschedulable"):
        return "unschedulable"
    if status.get("weights") == "preparing":
        return "preparing"
    if counts["ready"]:
        return "ready"
    if counts["starting"] or counts["loading"] or counts["prewarmed"]:
        return "starting"
    if counts["sleeping"]:
        return "sleeping"
    return "scaled_to_zero"


@router.post("", status_code=201)
async def create_deployment(
    body: DeploymentCreate,
    caller: CallerDep,
    services: ServicesDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> dict[str, Any]:
    tenancy.check_fields(caller, body.model_dump())
    body.source = _checked_source(services.engines, caller, body.source)
    await _check_template(body)
    create_only = if_none_match == "*"  # the client wants a new deployment or a 409
    existing = await services.state.get_deployment(body.name)
    if (
        existing is not None
        and not create_only
        and tenancy.manages(caller, {"owner": existing.owner})
    ):
        adapters.refuse_new_version(existing, body.base)
        return await _deploy_version(services, caller, existing, body)
    tenancy.check_new_name(caller, body.name, existing)  # before any answer on the name
    spec = DeploymentSpec(
        **body.changes(EngineSpec(), ServingOptions()),
        created_at_s=time.time(),
        uid=new_deployment_uid(),
    )
    spec = tenancy.created_by(caller, spec)
    if spec.base:  # a LoRA adapter, served by its base's runners
        # Its base's prices unless the admin gives its own (ebb.frontdoor.adapter_prices).
        spec.prices_set_by_admin = priced_by_admin(caller, body.model_dump())
        if not caller.is_admin:  # before its files are read: only within its prefixes
            check_source(caller.tenant, await services.quotas.get(caller.tenant), spec.source)
        weights_dir = services.settings.weights_dir
        spec = await adapters.check_new_adapter(services.state, caller, spec, weights_dir)
    _check_bounds(spec)
    await _check_engine(services.state, spec)
    seal_env(services, body.env)  # refused before anything is stored
    if not await tenancy.store(services, caller, spec, create_only=True):
        raise Conflict(
            f"A deployment named {spec.name!r} already exists. Change it with PATCH "
            f"/v1/deployments/{spec.name} ('ebb scale'), deploy a new version of it "
            "(without If-None-Match), or delete it first.",
            param="name",
        )
    await keep_first_env(services, spec, body.env)
    if not spec.base and services.engines.entry_for(spec.source).prepares_weights:
        # The controller's preparer prefetches them, so the first cold start finds the
        # weights in the cache; until it reports, they are asked for.
        await services.state.set_deployment_status(
            spec.name, **WeightsStatus(WeightsState.PREPARING).fields()
        )
    await services.state.wake(spec.name)
    if not spec.base:
        services.catalog.warm(spec)  # its tokenizer, once the weights are ready
    return await deployment_view(services.state, spec)


async def _deploy_version(
    services: Services, caller: Caller, existing: DeploymentSpec, body: DeploymentCreate
) -> dict[str, Any]:
    """An existing name its caller manages: the body is its next version
    (`ebb.frontdoor.deploy_versions`). A tenant's stays within its quota: its source, the
    versions it keeps, and the deployment serving only it (its GPUs once rolled out; the
    rollout itself is checked when it starts)."""
    quota = None if caller.is_admin else await services.quotas.get(caller.tenant)
    if not caller.is_admin:
        check_source(caller.tenant, quota, body.source)

    async def check(spec: DeploymentSpec) -> None:
        if spec.base:  # a LoRA adapter's version: its files, as at creation
            weights_dir = services.settings.weights_dir
            await adapters.check_adapter_version(services.state, spec, weights_dir)
        _check_bounds(spec)
        await _check_engine(services.state, spec)
        if not caller.is_admin:
            await check_version_quota(services, caller.tenant, quota, existing, spec)

    def changes(latest: DeploymentSpec) -> dict[str, Any]:
        fields = body.changes(latest.engine, latest.serving)
        if existing.base and priced_by_admin(caller, body.model_dump()):
            fields["prices_set_by_admin"] = True  # the admin priced this version
        return fields

    limit = versions_limit(quota, admin=caller.is_admin)
    try:
        record = await deploy_version(
            services, existing, changes, body.env, check, max_versions=limit
        )
    except TooManyVersions as e:
        raise versions_refusal(caller, existing.name, e.kept, limit) from e
    view = await deployment_view(services.state, existing)
    return {**view, "deployed_version": record.version}


# What a tenant key sees of a deployment it may call: its name, status and model facts.
# Not its source, owner, GPU price, runners (PIDs, log lines) or error details: those are
# the operator's (and may name paths, hosts or other tenants).
_TENANT_FIELDS = (
    "object",
    "name",
    "status",
    "created_at_s",
    "max_model_len",
    "min_replicas",
    "max_replicas",
    "idle_timeout_s",
    "admission_timeout_s",
    "price_per_1m_input_tokens_micros",
    "price_per_1m_output_tokens_micros",
    "replicas",
    "queue_depth",
    "job_queue_depth",
    "oldest_wait_s",
    "weights",
    "weights_progress",
    "cold_start_ms",
    "base",
)


def visible_to(caller: Caller, view: dict[str, Any]) -> dict[str, Any]:
    """`view` as `caller` may see it (the admin and the owner: all of it)."""
    if tenancy.manages(caller, view):
        return view
    return {**{k: view[k] for k in _TENANT_FIELDS}, "runners": [], "error": None, "error_log": None}


@router.get("")
async def list_deployments(caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    specs = await tenancy.visible_deployments(services.state, caller)
    views = [visible_to(caller, await deployment_view(services.state, s)) for s in specs]
    return {"object": "list", "data": views}


@router.get("/{name}")
async def get_deployment(name: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    state = services.state
    spec = await tenancy.visible_deployment(state, caller, name, as_model=False)
    view = visible_to(caller, await deployment_view(state, spec))
    # Only the single-deployment view carries log lines: lists stay cheap to poll.
    for runner in view["runners"]:
        runner["log_tail"] = (await state.runner_log(runner["id"]))[-RUNNER_LOG_TAIL_LINES:]
    return view


@router.patch("/{name}")
async def patch_deployment(
    name: str, body: DeploymentPatch, caller: CallerDep, services: ServicesDep
) -> dict[str, Any]:
    spec = await tenancy.managed_deployment(services.state, caller, name)
    tenancy.check_fields(caller, body.model_dump())
    await refuse_version_fields(services.state, name, body.model_fields_set)
    await _check_template(body)
    spec = msgspec.structs.replace(spec, **body.changes(spec.engine, spec.serving))
    if spec.base and priced_by_admin(caller, body.model_dump()):
        spec.prices_set_by_admin = True  # `ebb price` on an adapter: the admin's prices
    _check_bounds(spec)
    await _check_engine(services.state, spec)
    if not await tenancy.store(services, caller, spec, create_only=False):
        # Deleted (and perhaps created again by someone else) since it was read.
        raise NotFound(f"No deployment {name!r}: it was deleted.", param="name")
    await services.state.wake(spec.name)
    return await deployment_view(services.state, spec)


@router.delete("/{name}")
async def delete_deployment(name: str, caller: CallerDep, services: ServicesDep) -> dict[str, Any]:
    await tenancy.managed_deployment(services.state, caller, name)
    await services.state.delete_deployment(name)
    return {"object": "deployment.deleted", "name": name, "deleted": True}
