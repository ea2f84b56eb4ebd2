"""Money: integer micro-units of currency (1_000_000 micros = 1.00), never floats.

Every ledger entry (one finished request, or one hour's piece of a runner's GPU time) is
priced on its own and rounded half up to a whole micro; totals are sums of entries, so an
invoice always adds up to its lines.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

MICROS_PER_UNIT = 1_000_000
TOKENS_PER_PRICE_UNIT = 1_000_000  # token prices are per 1M tokens
MS_PER_S = 1000


def divide_half_up(numerator: int, denominator: int) -> int:
    """round(numerator / denominator) with halves rounded up, for numerator >= 0."""
    return (2 * numerator + denominator) // (2 * denominator)


def token_cost_micros(
    prompt_tokens: int,
    completion_tokens: int,
    price_per_1m_input_tokens_micros: int,
    price_per_1m_output_tokens_micros: int,
) -> int:
    return divide_half_up(
        prompt_tokens * price_per_1m_input_tokens_micros
        + completion_tokens * price_per_1m_output_tokens_micros,
        TOKENS_PER_PRICE_UNIT,
    )


def gpu_cost_micros(gpu_ms: int, price_per_gpu_second_micros: int) -> int:
    """`gpu_ms` already multiplied by the runner's GPU count."""
    return divide_half_up(gpu_ms * price_per_gpu_second_micros, MS_PER_S)


def parse_money(text: str, what: str) -> int:
    """A decimal amount like "0.50" as micros; ValueError naming `what` if it is not one."""
    try:
        amount = Decimal(text.strip())
    except InvalidOperation as e:
        raise ValueError(f"{what}: {text!r} is not a decimal amount like 0.50") from e
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"{what}: {text!r} must be zero or more")
    micros = amount * MICROS_PER_UNIT
    if micros != micros.to_integral_value():
        raise ValueError(f"{what}: {text!r} has more than 6 decimals (a micro-unit)")
    return int(micros)


def format_micros(micros: int) -> str:
    """12_345_600 -> "12.345600": exact, for tables."""
    return str((Decimal(micros) / MICROS_PER_UNIT).quantize(Decimal("0.000001"), ROUND_HALF_UP))


def format_money(micros: int) -> str:
    """150_000 -> "$0.15", 278 -> "$0.000278": exact, with the cents always shown and no
    trailing zeros past them, as the console shows money (the JSON keeps the micros)."""
    exact = format_micros(abs(micros)).rstrip("0")
    whole, _, cents = exact.partition(".")
    return f"{'-' if micros < 0 else ''}${whole}.{cents.ljust(2, '0')}"
