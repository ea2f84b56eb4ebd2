"""What an adapter's requests pay (`adapter_prices`), how its base's GPU time is shared
among the adapters it served (`adapter_gpu`), and the log redaction a base runner applies
while it loads another tenant's adapter (`ebb.logs.redacting`)."""

from __future__ import annotations

import io
import logging

import msgspec
import pytest

from ebb import logs
from ebb.billing.adapter_gpu import AdapterOf, adapter_gpu_rows, split_by_weight
from ebb.billing.entries import aggregate_field
from ebb.billing.usage import UsageQuery, report
from ebb.frontdoor.adapter_prices import as_served, inherit_prices, priced_by_admin
from ebb.frontdoor.caller import Caller
from ebb.queue.schema import DeploymentSpec, ServingOptions

ADMIN = Caller(tenant="admin", key_id="", is_admin=True)
TENANT = Caller(tenant="beta", key_id="k", is_admin=False)


def _spec(name: str, inp: int, out: int, discount: int = 0, **extra) -> DeploymentSpec:
    return DeploymentSpec(
        name=name,
        source="/x",
        price_per_1m_input_tokens_micros=inp,
        price_per_1m_output_tokens_micros=out,
        serving=ServingOptions(batch_discount_pct=discount),
        **extra,
    )


def _prices(spec: DeploymentSpec) -> tuple[int, int, int]:
    return (
        spec.price_per_1m_input_tokens_micros,
        spec.price_per_1m_output_tokens_micros,
        spec.serving.batch_discount_pct,
    )


def test_an_adapter_pays_at_least_its_base_unless_the_admin_priced_it():
    base = _spec("pub", 1000, 3000, discount=50)
    free = _spec("beta-free", 0, 0, base="pub")
    assert _prices(inherit_prices(free, base)) == (1000, 3000, 50)
    dearer = _spec("beta-dear", 2000, 100, discount=80, base="pub")
    assert _prices(as_served(dearer, base)) == (2000, 3000, 50)
    assert _prices(as_served(free, base)) == (1000, 3000, 0)
    admin_priced = msgspec.structs.replace(free, prices_set_by_admin=True)
    assert _prices(as_served(admin_priced, base)) == (0, 0, 0)
    assert _prices(inherit_prices(admin_priced, base)) == (0, 0, 0)
    model = _spec("m", 0, 0)  # not an adapter: its own prices, whatever is given
    assert as_served(model, base) is model


@pytest.mark.parametrize(
    ("caller", "given", "expected"),
    [
        (ADMIN, {"price_per_1m_input_tokens_micros": 0}, True),
        (ADMIN, {"serving": {"batch_discount_pct": 10}}, True),
        (ADMIN, {"price_per_1m_input_tokens_micros": None, "serving": None}, False),
        (ADMIN, {"price_per_gpu_second_micros": 5}, False),  # not a token price
        (TENANT, {"price_per_1m_input_tokens_micros": 5}, False),
    ],
)
def test_only_the_admin_giving_token_prices_or_the_discount_prices_an_adapter(
    caller, given, expected
):
    assert priced_by_admin(caller, given) is expected


def _aggregates(hour_ms: int, fields: dict[tuple[str, str, str], int]) -> dict:
    return {hour_ms: {aggregate_field(*k): n for k, n in fields.items()}}


ADAPTERS = {
    "beta-ad": AdapterOf(base="pub", owner="beta", uid="dep_b"),
    "gamma-ad": AdapterOf(base="pub", owner="gamma", uid="dep_g"),
}
HOUR = 3_600_000


def test_a_bases_gpu_time_is_split_by_tokens_exactly_among_its_adapters():
    aggregates = _aggregates(
        HOUR,
        {
            ("admin", "pub", "gpu_ms"): 1001,
            ("admin", "pub", "prompt_tokens"): 10,  # the base's own, every caller's
            ("acme", "pub", "completion_tokens"): 10,
            ("beta", "beta-ad", "prompt_tokens"): 50,
            ("acme", "beta-ad", "completion_tokens"): 10,
            ("gamma", "gamma-ad", "completion_tokens"): 20,
            ("admin", "other", "gpu_ms"): 999,  # serves no adapter: not split
        },
    )
    rows = adapter_gpu_rows(aggregates, 0, 2 * HOUR, ADAPTERS, None)
    split = {r["adapter"]: (r["tokens"], r["gpu_ms"]) for r in rows}
    assert split == {None: (20, 200), "beta-ad": (60, 601), "gamma-ad": (20, 200)}
    assert sum(r["gpu_ms"] for r in rows) == 1001
    assert {(r["base"], r["base_owner"]) for r in rows} == {("pub", "admin")}
    # Outside the window: nothing.
    assert adapter_gpu_rows(aggregates, 2 * HOUR, 3 * HOUR, ADAPTERS, None) == []


def test_the_bases_owner_sees_other_tenants_adapters_by_identity_only():
    aggregates = _aggregates(
        HOUR,
        {
            ("beta", "pub", "gpu_ms"): 100,
            ("beta", "beta-ad", "prompt_tokens"): 1,
            ("gamma", "gamma-ad", "prompt_tokens"): 1,
        },
    )
    rows = adapter_gpu_rows(aggregates, 0, 2 * HOUR, ADAPTERS, "beta")
    assert {(r["adapter"], r["adapter_owner"]) for r in rows} == {
        (None, None),
        ("beta-ad", "beta"),
        ("dep_g", None),
    }
    assert adapter_gpu_rows(aggregates, 0, 2 * HOUR, ADAPTERS, "gamma") == []  # not its GPUs
    query = UsageQuery(start_ms=0, end_ms=2 * HOUR, tenant="beta")
    assert report(aggregates, query, 0, ADAPTERS)["adapter_gpu"] == rows


def test_split_by_weight_is_whole_and_exact():
    assert split_by_weight(10, {"": 1, "a": 1, "b": 1}) == {"": 4, "a": 3, "b": 3}
    assert split_by_weight(7, {"": 0, "a": 0}) == {"": 7, "a": 0}
    assert sum(split_by_weight(1_000_003, {"": 3, "a": 7, "b": 11}).values()) == 1_000_003


def test_redacting_replaces_private_text_in_every_line_written_within_it():
    out = io.StringIO()
    handler = logs._formatted(logging.StreamHandler(out), "text")
    logger = logging.getLogger("test.redacting")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with logs.redacting({"/tmp/beta/a1": "adapter dep_1", "beta-free": "adapter dep_1"}):
            logger.warning("published file://%s for %s", "/tmp/beta/a1", "beta-free")
        logger.warning("after: %s", "beta-free")
    finally:
        logger.removeHandler(handler)
    first, second = out.getvalue().splitlines()
    assert "published file://adapter dep_1 for adapter dep_1" in first
    assert "/tmp/beta" not in first and "beta-free" not in first
    assert second.endswith("after: beta-free")  # outside it: untouched
