"""Who may see, call and change which deployment (tenant self-service).

- The admin sees and changes everything.
- A tenant sees and calls its own deployments (`owner`), public ones (every deployment
  the admin creates, unless made private) and private ones whose `shared_with` names it.
  Anything else does not exist for it: a 404, never a 403 that would confirm the name.
- A tenant changes and deletes only its own, within the quota the admin set
  (`ebb.frontdoor.quotas`), counted over every version that holds or may hold runners,
  and names new ones within its namespace (`<tenant>-...`), so that creating one never
  tells whether another tenant's private name exists. Prices (and the Batch API's
  discount), the owner, `visibility` and `shared_with` stay the admin's: they decide who
  pays and who may call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from ebb.errors import NotFound, PermissionDenied
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.quotas import check_change, check_source, footprints
from ebb.frontdoor.services import Services
from ebb.queue.platform import PlatformState
from ebb.queue.quotas import Holdings, TenantQuota
from ebb.queue.schema import DeploymentSpec
from ebb.queue.version_store import VersionStore
from ebb.queue.versions import TrafficSplit

# Fields of a deployment body only the admin may set.
ADMIN_ONLY_FIELDS = (
    "price_per_1m_input_tokens_micros",
    "price_per_1m_output_tokens_micros",
    "price_per_gpu_second_micros",
    "visibility",
    "shared_with",
    "priority",
)
# Fields of a deployment body's `serving` only the admin may set: the Batch API's price.
ADMIN_ONLY_SERVING_FIELDS = ("batch_discount_pct",)


def can_see(caller: Caller, spec: DeploymentSpec) -> bool:
    return (
        caller.is_admin
        or spec.owner == caller.tenant
        or spec.visibility == "public"
        or caller.tenant in spec.shared_with
    )


def manages(caller: Caller, view: dict[str, Any]) -> bool:
    """May change it, and sees all of it (a deployment's view or spec as builtins)."""
    return caller.is_admin or view.get("owner") == caller.tenant


def _not_found(name: str, *, as_model: bool) -> NotFound:
    if as_model:
        return NotFound(
            f"The model {name!r} does not exist. GET /v1/models lists the deployed models; "
            "deploy one with 'ebb deploy'.",
            param="model",
            code="model_not_found",
        )
    return NotFound(f"No deployment named {name!r}. 'ebb deployments' lists them.", param="name")


async def visible_deployment(
    state: PlatformState, caller: Caller, name: str, *, as_model: bool = True
) -> DeploymentSpec:
    """The deployment `caller` may call by `name`, or a 404 (the model's, by default)."""
    return visible_or_404(caller, name, await state.get_deployment(name), as_model=as_model)


def visible_or_404(
    caller: Caller, name: str, spec: DeploymentSpec | None, *, as_model: bool = True
) -> DeploymentSpec:
    """`spec` (the deployment named `name`, as read) if `caller` may call it, else a 404."""
    if spec is None or not can_see(caller, spec):
        raise _not_found(name, as_model=as_model)
    return spec


async def visible_deployments(state: PlatformState, caller: Caller) -> list[DeploymentSpec]:
    return [s for s in await state.list_deployments() if can_see(caller, s)]


async def managed_deployment(state: PlatformState, caller: Caller, name: str) -> DeploymentSpec:
    """The deployment `caller` may change: 404 when it may not see it, 403 when it only
    calls it (shared or public)."""
    spec = await visible_deployment(state, caller, name, as_model=False)
    if not manages(caller, {"owner": spec.owner}):
        raise PermissionDenied(
            f"Deployment {name!r} belongs to another tenant; only its owner or the admin may "
            "change or delete it."
        )
    return spec


def _admin_only_message(field: str) -> str:
    if field == "priority":
        # A class decides which GPUs its runners may share and whose work waits: the
        # admin's, for deployments and callers alike.
        return (
            "priority is set by the admin ('ebb deploy --priority'): a deployment's class "
            "decides which GPUs its runners may share. A tenant may set its deployment's "
            "source, scaling and serving settings, within its quota, but not its priority, "
            "prices, visibility or sharing; the class its own requests are queued in comes "
            "from its key's or tenant's limits, which the admin sets too. Leave it out."
        )
    return f"{field} is set by the admin ('ebb price', 'ebb deployments share'); leave it out."


def check_fields(caller: Caller, given: dict[str, Any]) -> None:
    """Refuse, for a tenant, body fields that are the admin's (`given`: the fields sent)."""
    if caller.is_admin:
        return
    for field in ADMIN_ONLY_FIELDS:
        if given.get(field) is not None:
            raise PermissionDenied(_admin_only_message(field), param=field)
    serving = given.get("serving") or {}
    for field in ADMIN_ONLY_SERVING_FIELDS:
        if serving.get(field) is not None:
            raise PermissionDenied(
                f"serving.{field} is a price, set by the admin; leave it out.",
                param=f"serving.{field}",
            )
    owner = given.get("owner")
    if owner is not None and owner != caller.tenant:
        raise PermissionDenied(
            f"A tenant's deployments are owned (and their GPU time billed) by itself: owner "
            f"must be {caller.tenant!r} or left out; the admin may hand one to another tenant.",
            param="owner",
        )


def created_by(caller: Caller, spec: DeploymentSpec) -> DeploymentSpec:
    """A new deployment as its creator makes it: a tenant's is its own, and private."""
    if caller.is_admin:
        return spec
    return msgspec.structs.replace(spec, owner=caller.tenant, visibility="private", shared_with=[])


def namespace(tenant: str) -> str:
    """What the names of the deployments `tenant` creates start with: its name, lowercased
    (deployment names are), and '-'."""
    return f"{tenant.lower()}-"


def namespace_clash(tenant: str, others: Iterable[str]) -> str | None:
    """Another tenant whose namespace nests with `tenant`'s (`acme-` and `acme-eu-`, or
    `Acme` and `acme`), if any: a tenant could then create names in the other's namespace
    and learn from a 409 which of its private names exist."""
    mine = namespace(tenant)
    for other in others:
        theirs = namespace(other)
        if other != tenant and (mine.startswith(theirs) or theirs.startswith(mine)):
            return other
    return None


def check_new_name(caller: Caller, name: str, existing: DeploymentSpec | None) -> None:
    """Refuse a tenant a new name outside its namespace, whether or not a deployment it
    cannot see has it: names are global, and a 409 there would tell the name exists. A
    name it sees (public, shared with it, its own) may still get the 409."""
    if caller.is_admin or (existing is not None and can_see(caller, existing)):
        return
    prefix = namespace(caller.tenant)
    if not name.startswith(prefix) or name == prefix:
        raise PermissionDenied(
            f"A tenant's new deployments are named within its namespace: start the name "
            f"with {prefix!r} (for example {prefix + 'chat'!r}); other names are the admin's.",
            param="name",
        )


async def store(
    services: Services,
    caller: Caller,
    spec: DeploymentSpec,
    *,
    create_only: bool,
) -> bool:
    """Write `spec` (False: `create_only` and the name is taken). A tenant's write is
    checked against its quota atomically with it; the admin's is not limited."""
    if caller.is_admin:
        return await services.state.put_deployment(spec, create_only=create_only)
    tenant = caller.tenant

    def check(quota: TenantQuota | None, before: Holdings, after: Holdings) -> None:
        check_change(tenant, quota, footprints(tenant, before), footprints(tenant, after))
        previous = before.specs.get(spec.name)
        if previous is None or previous.source != spec.source:
            check_source(tenant, quota, spec.source)

    return await services.quotas.put_deployment(tenant, spec, check, create_only=create_only)


async def store_split(
    services: Services,
    caller: Caller,
    spec: DeploymentSpec,
    change: Callable[[TrafficSplit], TrafficSplit],
) -> TrafficSplit:
    """Apply `change` to the deployment's traffic split (a rollout starts, a rollback).
    On a tenant's deployment, by the tenant, it is checked against the quota atomically
    with the write: both ends of a rollout may hold runners at once."""
    if caller.is_admin:
        return await VersionStore(services.state.redis).update_split(spec.name, change)
    tenant = caller.tenant

    def check(quota: TenantQuota | None, before: Holdings, after: Holdings) -> None:
        check_change(tenant, quota, footprints(tenant, before), footprints(tenant, after))

    return await services.quotas.put_split(tenant, spec.name, change, check)
