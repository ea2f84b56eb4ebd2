"""Money in integer micros: rounding, parsing and formatting."""

from __future__ import annotations

import pytest

from ebb.billing.pricing import (
    divide_half_up,
    format_micros,
    format_money,
    gpu_cost_micros,
    parse_money,
    token_cost_micros,
)


@pytest.mark.parametrize(
    ("numerator", "denominator", "expected"),
    [(0, 7, 0), (5, 10, 1), (4, 10, 0), (15, 10, 2), (14, 10, 1), (10**30 + 5, 10, 10**29 + 1)],
)
def test_divide_half_up(numerator, denominator, expected):
    assert divide_half_up(numerator, denominator) == expected


def test_token_cost_is_priced_per_million_and_rounded_once_per_request():
    # 24 prompt tokens at 0.50/1M and 7 completion tokens at 1.50/1M: 12 + 10.5 micros.
    assert token_cost_micros(24, 7, 500_000, 1_500_000) == 23
    assert token_cost_micros(1_000_000, 1_000_000, 150_000, 600_000) == 750_000
    assert token_cost_micros(10, 10, 0, 0) == 0


def test_gpu_cost_is_priced_per_second_to_the_millisecond():
    assert gpu_cost_micros(3_780, 1_000) == 3_780
    assert gpu_cost_micros(1, 400) == 0  # 0.4 micros rounds down
    assert gpu_cost_micros(2, 250) == 1  # 0.5 micros rounds up
    assert gpu_cost_micros(3_600_000, 1_111) == 3_999_600


@pytest.mark.parametrize(
    ("text", "micros"),
    [("0.50", 500_000), ("1", 1_000_000), ("0.000001", 1), (" 12.345678 ", 12_345_678), ("0", 0)],
)
def test_parse_money_is_exact(text, micros):
    assert parse_money(text, "--input") == micros


@pytest.mark.parametrize(
    ("text", "says"),
    [("abc", "decimal amount"), ("-1", "zero or more"), ("0.0000001", "6 decimals"), ("nan", "")],
)
def test_parse_money_refuses_what_is_not_money(text, says):
    with pytest.raises(ValueError, match="--input") as refused:
        parse_money(text, "--input")
    assert says in str(refused.value)


def test_format_micros():
    assert format_micros(12_345_600) == "12.345600"
    assert format_micros(1) == "0.000001"
    assert format_micros(0) == "0.000000"


def test_format_money_shows_cents_and_no_more_zeros_than_needed():
    assert format_money(150_000) == "$0.15"
    assert format_money(278) == "$0.000278"
    assert format_money(12_345_600) == "$12.3456"
    assert format_money(0) == "$0.00"
    assert format_money(-5_000_000) == "-$5.00"
