"""Costs and hours read the same in the CLI and the console (kiln.domain.usage.format_money/format_hours beside
console/src/format.ts, compared by tests/e2e/test_console.py): a budget of 0.001 is not printed as 0.00."""

from __future__ import annotations

import pytest

from kiln.domain.usage import format_hours, format_money


@pytest.mark.parametrize(
    ("amount", "currency", "text"),
    [
        (0.0015, None, "0.0015"),
        (0.001, "EUR", "0.001 EUR"),
        (0.0, None, "0.00"),
        (1234.5, None, "1,234.50"),
        (0.01, None, "0.01"),
        (0.000001, None, "0.000001"),
        (-0.004, None, "-0.004"),
        (None, None, "-"),
    ],
)
def test_a_small_cost_keeps_two_significant_digits(amount: float | None, currency: str | None, text: str) -> None:
    assert format_money(amount, currency) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0"), (6, "0.00167"), (36, "0.01"), (3600 * 12.34, "12.3"), (3600 * 1234.4, "1,234"), (0.01, "2.78e-6")],
)
def test_hours_keep_three_significant_digits(seconds: float, text: str) -> None:
    assert format_hours(seconds) == text
