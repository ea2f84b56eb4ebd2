"""LoRA adapter deployments: checked at deploy, served by their base's runners.

An adapter deployment (`DeploymentSpec.base` set) has no runners, queue or weights
preparation of its own. At deploy its base must exist, be callable by the adapter's
creator, generate, and run with LoRA on, and the adapter's files (when the frontdoor can
read them: a local source) must fit the base (`ebb.weights_cache.adapters`); it is bound
to the base's identity (`base_uid`). A request naming it goes into the queue of the
base's serving unit, carrying an `AdapterRef`, so that any of the base's runners takes it,
batched with the base's own requests and other adapters'; it is billed under the
adapter's name and prices (the runner's usage record).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec

from ebb.engine_options import LoraLimits, lora_limits
from ebb.errors import InvalidRequest, NotFound
from ebb.frontdoor import tenancy
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.version_routing import ROUTE_KEY_HEADER, Routed
from ebb.queue.platform import PlatformState
from ebb.queue.schema import AdapterRef, DeploymentSpec
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
    limits = _base_limits(spec, base)
    source = _adapter_source(spec.source)
    if isinstance(source, LocalDirSource):
        try:
            facts = read_adapter(Path(source.path))
            base_config = cached_base_config(base.source, weights_dir)
            check_against_base(facts, base_config, limits.max_lora_rank)
        except AdapterError as e:
            message = f"The adapter at {spec.source} cannot be served: {e.message}."
            raise InvalidRequest(message, param="source") from e
    return msgspec.structs.replace(spec, base_uid=base.uid, min_replicas=0)


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
    state: PlatformState, route: Routed, headers: Mapping[str, str] | None = None
) -> tuple[Routed, AdapterRef | None]:
    """Where a request for `route`'s deployment is queued: itself (no adapter), or for an
    adapter, its base's serving unit (by the base's traffic split) and the adapter to run
    with. A base deleted since (or another one under its name) is a 404."""
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
    if base is None or (adapter.base_uid and base.uid != adapter.base_uid):
        name = public_name(adapter.name)
        raise NotFound(
            f"The base deployment {adapter.base!r} of the adapter {name!r} was deleted; "
            f"deploy the adapter again on a base.",
            param="model",
        )
    ref = AdapterRef(name=adapter.name, uid=adapter.uid, source=adapter.source)
    return Routed(spec=base, status=read.status, depth=read.depth), ref


def refuse_new_version(existing: DeploymentSpec, base: str | None) -> None:
    """A 400 for a new version that is, or would make, an adapter: an adapter's checks
    and binding to its base are made at creation only, so versions of adapters (and a
    model turned adapter) are refused until they are checked as a new one is."""
    if existing.base or base:
        raise InvalidRequest(
            f"{existing.name!r} cannot get a new version as an adapter: versions of LoRA "
            "adapter deployments are not supported yet. Delete it and deploy it again, or "
            "deploy the adapter under a new name.",
            param="base",
        )


def refuse_adapter(spec: DeploymentSpec, what: str) -> None:
    """A 400 for an endpoint adapters do not serve yet (`what`)."""
    if spec.base:
        raise InvalidRequest(
            f"{public_name(spec.name)!r} is a LoRA adapter of {spec.base!r}; {what} are not "
            "served for adapters yet: use chat or completions, or the base model.",
            param="model",
        )
