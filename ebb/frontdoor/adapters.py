"""LoRA adapter deployments: checked at deploy, served by their base's runners.

An adapter deployment (`DeploymentSpec.base` set) has no runners, queue or weights
preparation of its own. At deploy its base must exist, be callable by the adapter's
creator, generate, and run with LoRA on, and the adapter's files (when the frontdoor can
read them: a local source) must fit the base (`ebb.weights_cache.adapters`); it is bound
to the base's identity (`base_uid`). A request naming it goes into the queue of the
base's serving unit, carrying an `AdapterRef`, so that any of the base's runners takes it,
batched with the base's own requests and other adapters'; it is billed under the
adapter's name, at prices never below its base's unless the admin priced the adapter
(`ebb.frontdoor.adapter_prices`). Every request, job, batch line and tokenize through an
adapter needs its caller's right to call the base, then (`served_by_base`): access taken
away since the adapter was deployed stops it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ebb.engine_options import LoraLimits, lora_limits
from ebb.errors import InvalidRequest, NotFound
from ebb.frontdoor import adapter_prices, tenancy
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.version_routing import ROUTE_KEY_HEADER, Routed, routed
from ebb.queue.job_schema import JobRecord
from ebb.queue.platform import PlatformState
from ebb.queue.schema import AdapterRef, DeploymentSpec, WorkItem
from ebb.queue.versions import pick_version, public_name, route_point
from ebb.weights_cache import LocalDirSource, Source, SourceKind, parse_source
from ebb.weights_cache.adapters import (
    AdapterError,
    cached_base_config,
    check_against_base,
    read_adapter,
)

# Sources an adapter may come from: a directory PEFT saved (local, S3, the Hub).
_ADAPTER_SOURCES = (SourceKind.LOCAL, SourceKind.S3, SourceKind.HF)


async def check_new_adapter(
    state: PlatformState, caller: Caller, spec: DeploymentSpec, weights_dir: Path
) -> DeploymentSpec:
    """`spec` (an adapter's, as its creator made it) bound to its base, or InvalidRequest
    naming the field to change."""
    base = await state.get_deployment(spec.base)
    if base is None or not tenancy.can_see(caller, base):
        raise InvalidRequest(
            f"There is no deployment {spec.base!r} you may use as a base; name one that "
            "`GET /v1/models` lists for you.",
            param="base",
        )
    # Off the event loop: reading a tenant's files can be slow (a network disk).
    await asyncio.to_thread(_check_source, spec, base, _base_limits(spec, base), weights_dir)
    spec = adapter_prices.inherit_prices(spec, base)
    return msgspec.structs.replace(spec, base_uid=base.uid, min_replicas=0)


def _check_source(
    spec: DeploymentSpec, base: DeploymentSpec, limits: LoraLimits, weights_dir: Path
) -> None:
    """The adapter's files against `base`, when the frontdoor can read them (a local
    source; a remote one is checked by the runner that loads it)."""
    source = _adapter_source(spec.source)
    if isinstance(source, LocalDirSource):
        try:
            facts = read_adapter(Path(source.path))
            base_config = cached_base_config(base.source, weights_dir)
            check_against_base(facts, base_config, limits.max_lora_rank)
        except AdapterError as e:
            message = f"The adapter at {spec.source} cannot be served: {e.message}."
            raise InvalidRequest(message, param="source") from e


def _base_limits(adapter: DeploymentSpec, base: DeploymentSpec) -> LoraLimits:
    """The LoRA limits of `base`, once it can serve adapters; InvalidRequest otherwise."""
    if base.base:
        raise InvalidRequest(
            f"{base.name!r} is itself an adapter (of {base.base!r}); name its base instead.",
            param="base",
        )
    if base.serving.task != "generate":
        raise InvalidRequest(
            f"{base.name!r} is an embedding deployment; adapters need a generative base.",
            param="base",
        )
    limits = lora_limits(base.engine)
    if limits is None:
        raise InvalidRequest(
            f"{base.name!r} runs without LoRA; deploy it (or a new version of it) with "
            "engine.enable_lora=true (`ebb deploy ... --enable-lora`), then the adapter "
            f"{adapter.name!r}.",
            param="base",
        )
    return limits


def _adapter_source(source: str) -> Source:
    parsed = parse_source(source)  # InvalidRequest naming the accepted forms
    if parsed.kind not in _ADAPTER_SOURCES:
        raise InvalidRequest(
            f"An adapter's source is the directory peft's save_pretrained wrote (a local "
            f"path, s3://bucket/prefix or hf://org/name); {source!r} is not one.",
            param="source",
        )
    return parsed


async def served_by_base(
    state: PlatformState,
    caller: Caller,
    route: Routed,
    headers: Mapping[str, str] | None = None,
) -> tuple[Routed, AdapterRef | None]:
    """Where a request for `route`'s deployment is queued: itself (no adapter), or for an
    adapter, its base's serving unit (by the base's traffic split) and the adapter to run
    with. A base deleted since (or another one under its name), or one `caller` may no
    longer call (unshared, made private), is a 404: the same answer, so that it tells
    nothing of a base the caller cannot see."""
    adapter = route.spec
    if not adapter.base:
        return route, None
    reads = state.admission_reads
    read = await reads.deployment(adapter.base)
    key = headers.get(ROUTE_KEY_HEADER) if headers is not None else None
    version = pick_version(read.split.weights, route_point(key))
    if read.spec is not None and version != 1:
        read = await reads.unit(adapter.base, version)
    base = read.spec
    if (
        base is None
        or (adapter.base_uid and base.uid != adapter.base_uid)
        or not tenancy.can_see(caller, base)
    ):
        name = public_name(adapter.name)
        raise NotFound(
            f"The base deployment {adapter.base!r} of the adapter {name!r} was deleted or "
            "is no longer one you may call; deploy the adapter again on a base that "
            "`GET /v1/models` lists for you.",
            param="model",
            code="model_not_found",
        )
    ref = AdapterRef(name=adapter.name, uid=adapter.uid, source=adapter.source)
    return Routed(spec=base, status=read.status, depth=read.depth), ref


@dataclass(frozen=True)
class JobTarget:
    """Where a job (or a Batch API line) naming `named` runs: `spec` is the unit whose
    queue and tokenizer it uses (an adapter's base), `named` prices it and names it, and
    `adapter` (None for a plain deployment) is what the base's runner runs it with. An
    adapter's `named` carries the prices its requests pay (`adapter_prices.as_served`)."""

    spec: DeploymentSpec
    named: DeploymentSpec
    adapter: AdapterRef | None

    @property
    def batch_discount_pct(self) -> int:
        """The Batch API's discount: the named deployment's, as its prices are."""
        return self.named.serving.batch_discount_pct


async def job_target(state: PlatformState, caller: Caller, model: str) -> JobTarget:
    """The unit a job for `model` (which `caller` may call) runs on, picked by the traffic
    split (its base's, for an adapter); the 404s of `routed` and `served_by_base`."""
    route = await routed(state, caller, model)
    served, adapter = await served_by_base(state, caller, route)
    named = adapter_prices.as_served(route.spec, served.spec)
    return JobTarget(spec=served.spec, named=named, adapter=adapter)


def adapter_work(work: WorkItem, target: JobTarget) -> WorkItem:
    """`work`, made for `target.spec`, carrying `target`'s adapter and priced at the
    prices its requests pay (a synchronous request's work item exactly); unchanged
    otherwise."""
    if target.adapter is None:
        return work
    return msgspec.structs.replace(
        work,
        adapter=target.adapter,
        price_per_1m_input_tokens_micros=target.named.price_per_1m_input_tokens_micros,
        price_per_1m_output_tokens_micros=target.named.price_per_1m_output_tokens_micros,
    )


def adapter_job(record: JobRecord, target: JobTarget) -> JobRecord:
    """A job record made for `target.spec`, run as `target`'s adapter and shown (`model`,
    listing by model) under the adapter's name; unchanged for a plain deployment."""
    if target.adapter is None:
        return record
    return msgspec.structs.replace(
        record,
        deployment=public_name(target.named.name),
        work=adapter_work(record.work, target),
    )


def refuse_new_version(existing: DeploymentSpec, base: str | None) -> None:
    """A 400 for a new version that would make an adapter of a model or move an adapter
    to another base: a version keeps what its deployment is (`base` is the deployment's,
    not a version's). A new version of an adapter names its base or leaves it out."""
    if base and base != existing.base:
        if existing.base:
            why = f"it is an adapter of {existing.base!r}, and its versions keep that base"
        else:
            why = "it is a model of its own, and its versions cannot be LoRA adapters"
        raise InvalidRequest(
            f"{existing.name!r} cannot get a new version with base {base!r}: {why}. Leave "
            "base out, or deploy the adapter under a new name.",
            param="base",
        )


async def check_adapter_version(
    state: PlatformState, spec: DeploymentSpec, weights_dir: Path
) -> None:
    """A new version of an adapter (`spec`, composed over its latest version): its source
    gets the checks it got at creation, against the base it is bound to; InvalidRequest
    naming `source` (or `base`, once that base is gone) with what to change."""
    base = await state.get_deployment(spec.base)
    if base is None or (spec.base_uid and base.uid != spec.base_uid):
        raise InvalidRequest(
            f"The base {spec.base!r} of the adapter {spec.name!r} was deleted; deploy the "
            "adapter again under a new name on a base.",
            param="base",
        )
    await asyncio.to_thread(_check_source, spec, base, _base_limits(spec, base), weights_dir)
