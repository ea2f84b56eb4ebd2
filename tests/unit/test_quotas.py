"""Tenant quotas and visibility as pure policy (ebb.frontdoor.quotas, ebb.frontdoor.tenancy)."""

from __future__ import annotations

import pytest

from ebb.errors import InvalidRequest, PermissionDenied, QuotaExceeded
from ebb.frontdoor.caller import Caller
from ebb.frontdoor.quotas import (
    Footprint,
    check_change,
    check_source,
    footprint,
    gpus_of,
    live_versions,
    use_of,
)
from ebb.frontdoor.tenancy import (
    can_see,
    check_fields,
    check_new_name,
    created_by,
    manages,
    namespace_clash,
)
from ebb.queue.quotas import TenantQuota
from ebb.queue.schema import DeploymentSpec, EngineSpec
from ebb.queue.versions import Rollout, TrafficSplit, VersionRecord

ACME = Caller(tenant="acme", key_id="key_a", is_admin=False)
BETA = Caller(tenant="beta", key_id="key_b", is_admin=False)
ADMIN = Caller(tenant="admin", key_id="admin", is_admin=True)
QUOTA = TenantQuota(max_deployments=2, max_replicas=4, max_gpus=4, allowed_sources=["hf://acme/"])


def spec(name: str, max_replicas: int = 1, tp: int | None = None, **fields) -> DeploymentSpec:
    engine = EngineSpec(tensor_parallel_size=tp)
    return DeploymentSpec(
        name=name, source="hf://acme/m", max_replicas=max_replicas, engine=engine, **fields
    )


def fp(*args, **kwargs) -> Footprint:
    """A deployment without versions at its peak."""
    return footprint(spec(*args, **kwargs), TrafficSplit(), {})


def test_use_sums_replicas_and_gpus_by_tensor_parallel_size():
    prints = [fp("a", 2), fp("b", 3, tp=2)]
    assert gpus_of(spec("b", 3, tp=2)) == 6
    assert use_of(prints) == use_of(prints[::-1])
    assert (use_of(prints).deployments, use_of(prints).replicas, use_of(prints).gpus) == (2, 5, 8)


def _version(number: int, tp: int) -> VersionRecord:
    return VersionRecord(version=number, created_at_s=0.0, spec=spec("a", tp=tp))


def test_every_version_that_may_hold_runners_counts_at_max_replicas():
    versions = {1: _version(1, 1), 2: _version(2, 4), 3: _version(3, 2)}
    # Version 2 deployed (no traffic yet) holds nothing.
    listed = TrafficSplit(weights={1: 100, 2: 0})
    assert live_versions(listed) == {1}
    assert footprint(spec("a", 2), listed, versions).gpus == 2
    # Rolling out version 2: it warms beside version 1, both up to max_replicas.
    rollout = Rollout(from_version=1, to_version=2, strategy="immediate", steps=[100])
    warming = TrafficSplit(weights={1: 100, 2: 0}, rollout=rollout)
    both = footprint(spec("a", 2), warming, versions)
    assert (both.replicas, both.gpus) == (4, 10)
    # Done: the old version only drains.
    done = Rollout(from_version=1, to_version=2, strategy="immediate", steps=[100], step=0)
    done.state = "done"
    assert footprint(spec("a", 2), TrafficSplit(weights={1: 0, 2: 100}, rollout=done),
                     versions).gpus == 8  # fmt: skip
    # A version's own engine counts, not the deployment record's.
    assert footprint(spec("a", 1), TrafficSplit(weights={3: 100}), versions).gpus == 2


def test_a_change_is_refused_only_when_it_raises_a_use_past_its_limit():
    before = {"a": fp("a", 2), "b": fp("b", 2)}
    check_change("acme", QUOTA, before, before)  # at the limit, unchanged: fine
    with pytest.raises(QuotaExceeded) as third:
        check_change("acme", QUOTA, before, {**before, "c": fp("c")})
    assert third.value.param == "max_deployments" and "owns 2" in third.value.message
    with pytest.raises(QuotaExceeded) as more:
        check_change("acme", QUOTA, before, {**before, "a": fp("a", 3)})
    assert more.value.param == "max_replicas" and "up to 5 replicas" in more.value.message
    with pytest.raises(QuotaExceeded) as gpus:
        check_change("acme", QUOTA, before, {**before, "a": fp("a", 1, tp=4)})
    assert gpus.value.param == "max_gpus" and "up to 6 GPUs" in gpus.value.message

    # Over a quota lowered afterwards: lowering the use is allowed, raising it is not.
    lowered = TenantQuota(max_deployments=1, max_replicas=1, max_gpus=1)
    check_change("acme", lowered, before, {**before, "a": fp("a", 1)})
    with pytest.raises(QuotaExceeded):
        check_change("acme", lowered, before, {**before, "a": fp("a", 3)})


def test_no_quota_means_nothing_and_says_how_to_grant_one():
    with pytest.raises(QuotaExceeded) as refused:
        check_change("acme", None, {}, {"a": fp("a")})
    assert "ebb tenants quota acme --max-deployments" in refused.value.message
    assert refused.value.status_code == 403 and refused.value.code == "quota_exceeded"


def test_sources_must_start_with_an_allowed_prefix():
    check_source("acme", QUOTA, "hf://acme/model@main")
    check_source("acme", TenantQuota(allowed_sources=["*"]), "s3://anything")
    with pytest.raises(QuotaExceeded, match="only sources starting with 'hf://acme/'"):
        check_source("acme", QUOTA, "hf://other/model")
    with pytest.raises(QuotaExceeded, match="may not deploy from any source yet"):
        check_source("acme", None, "hf://acme/model")


def test_sources_are_checked_normalized_and_on_segment_boundaries():
    quota = TenantQuota(allowed_sources=["/allowed/", "s3://acme-models"])
    check_source("acme", quota, "/allowed//m/")
    check_source("acme", quota, "file:///allowed/m")
    check_source("acme", quota, "s3://acme-models/m")
    with pytest.raises(QuotaExceeded):
        check_source("acme", quota, "s3://acme-models-evil/m")
    for climbing in ("/allowed/../etc", "file:///allowed/%2e%2e/etc", "/allowed//../etc"):
        with pytest.raises(InvalidRequest):
            check_source("acme", quota, climbing)


def test_who_sees_and_who_manages():
    public = spec("pub")  # the admin's: public, owned by the admin
    private = spec("priv", owner="acme", visibility="private", shared_with=["beta"])
    hidden = spec("hid", owner="acme", visibility="private")
    assert all(can_see(c, public) for c in (ACME, BETA, ADMIN))
    assert can_see(BETA, private) and not can_see(BETA, hidden) and can_see(ACME, hidden)
    assert manages(ACME, {"owner": "acme"}) and not manages(BETA, {"owner": "acme"})
    assert manages(ADMIN, {"owner": "acme"}) and not manages(ACME, {"owner": "admin"})


def test_a_tenant_creates_its_own_private_deployment_and_no_admin_fields():
    made = created_by(ACME, spec("new", visibility="public", shared_with=["x"]))
    assert (made.owner, made.visibility, made.shared_with) == ("acme", "private", [])
    assert created_by(ADMIN, spec("new")).visibility == "public"
    check_fields(ACME, {"owner": "acme", "max_replicas": 2})
    check_fields(ADMIN, {"owner": "beta", "price_per_gpu_second_micros": 5})
    for given in ({"owner": "beta"}, {"price_per_gpu_second_micros": 5}, {"shared_with": []}):
        with pytest.raises(PermissionDenied):
            check_fields(ACME, given)
    # The Batch API's discount is a price too; the rest of `serving` is the tenant's.
    check_fields(ACME, {"serving": {"tool_parser": "hermes", "batch_discount_pct": None}})
    check_fields(ADMIN, {"serving": {"batch_discount_pct": 100}})
    with pytest.raises(PermissionDenied) as discount:
        check_fields(ACME, {"serving": {"batch_discount_pct": 100}})
    assert discount.value.param == "serving.batch_discount_pct"


def test_a_tenant_names_new_deployments_within_its_namespace_whatever_exists():
    hidden = spec("beta-x", owner="beta", visibility="private")
    for existing in (None, hidden):  # free, or another tenant's private name: one answer
        with pytest.raises(PermissionDenied) as outside:
            check_new_name(ACME, "beta-x", existing)
        assert outside.value.param == "name" and "'acme-'" in outside.value.message
    check_new_name(ACME, "acme-x", None)
    check_new_name(ACME, "pub", spec("pub"))  # public: it sees it (the 409 may say so)
    check_new_name(ADMIN, "anything", hidden)
    with pytest.raises(PermissionDenied):
        check_new_name(ACME, "acme-", None)


def test_tenant_namespaces_never_nest():
    assert namespace_clash("acme-eu", ["acme", "beta"]) == "acme"
    assert namespace_clash("acme", ["acme-eu"]) == "acme-eu"
    assert namespace_clash("Acme", ["acme"]) == "acme"  # one namespace, lowercased
    assert namespace_clash("acme", ["acme", "acmeeu", "acme.eu"]) is None
