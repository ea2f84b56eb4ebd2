"""What an adapter's requests pay: never less than its base's, unless the admin priced it.

An adapter answers with its base's GPUs (a zero-initialised LoRA answers exactly as its
base), so the base's prices are its floor: a tenant must not get a priced base's answers
for free, or past its budget, through an adapter of its own.

- A new adapter takes its base's token prices and Batch API discount, unless the admin
  gives any of them at deploy (a tenant never may: prices are the admin's).
- Each request for an adapter whose prices the admin did not set pays, per token price,
  the higher of the adapter's and the base version's serving it, and the lower of their
  Batch API discounts: what the base's own request would pay, or more. These prices are
  the work item's, so the spend caps reserve, the ledger bills and the usage shows them.
- The admin setting any of an adapter's token prices or its discount (at deploy, PATCH
  or a new version: `ebb price`) marks them the admin's (`prices_set_by_admin`): its
  requests then pay exactly the adapter's prices, which may be below the base's.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ebb.frontdoor.caller import Caller
from ebb.queue.schema import DeploymentSpec

# The body fields (top level) that price an adapter's requests.
TOKEN_PRICE_FIELDS = ("price_per_1m_input_tokens_micros", "price_per_1m_output_tokens_micros")


def priced_by_admin(caller: Caller, given: dict[str, Any]) -> bool:
    """Whether `given` (a deployment body's fields, as sent) has the admin set token
    prices or the Batch API discount."""
    if not caller.is_admin:
        return False
    serving = given.get("serving") or {}
    return (
        any(given.get(f) is not None for f in TOKEN_PRICE_FIELDS)
        or serving.get("batch_discount_pct") is not None
    )


def inherit_prices(adapter: DeploymentSpec, base: DeploymentSpec) -> DeploymentSpec:
    """A new adapter with its base's token prices and discount, unless the admin set its
    own."""
    if adapter.prices_set_by_admin:
        return adapter
    return msgspec.structs.replace(
        adapter,
        price_per_1m_input_tokens_micros=base.price_per_1m_input_tokens_micros,
        price_per_1m_output_tokens_micros=base.price_per_1m_output_tokens_micros,
        serving=msgspec.structs.replace(
            adapter.serving, batch_discount_pct=base.serving.batch_discount_pct
        ),
    )


def as_served(named: DeploymentSpec, served: DeploymentSpec) -> DeploymentSpec:
    """`named` (the deployment a request names) with the prices its request pays when
    `served` serves it: unchanged for a model or an adapter the admin priced; otherwise
    never below `served` (the base's version taking it)."""
    if not named.base or named.prices_set_by_admin:
        return named
    return msgspec.structs.replace(
        named,
        price_per_1m_input_tokens_micros=max(
            named.price_per_1m_input_tokens_micros, served.price_per_1m_input_tokens_micros
        ),
        price_per_1m_output_tokens_micros=max(
            named.price_per_1m_output_tokens_micros, served.price_per_1m_output_tokens_micros
        ),
        serving=msgspec.structs.replace(
            named.serving,
            batch_discount_pct=min(
                named.serving.batch_discount_pct, served.serving.batch_discount_pct
            ),
        ),
    )
