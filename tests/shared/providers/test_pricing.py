"""Cost of a call from the price table."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from shared.errors import ConfigError
from shared.providers import PriceTable
from shared.settings import Price

TABLE = PriceTable.of(
    {
        "gpt-4o": Price(input=2.5, output=10.0),
        "gpt-4o-mini": Price(input=0.15, output=0.6),
        "claude-3-5-sonnet": Price(input=3.0, output=15.0),
    }
)


def test_cost_per_million_tokens() -> None:
    """USD = (input x input price + output x output price) / 1e6."""
    assert TABLE.cost("gpt-4o", 2_000_000, 500_000) == pytest.approx(5.0 + 5.0)
    assert TABLE.cost("gpt-4o-mini", 1000, 1000) == pytest.approx(0.00075)


def test_unknown_model_costs_zero() -> None:
    """A model without a price costs 0.0 (and None too)."""
    assert TABLE.cost("llama3:8b", 10_000, 10_000) == 0.0
    assert TABLE.cost(None, 10_000, 10_000) == 0.0


def test_dated_snapshots_use_the_base_price() -> None:
    """`-YYYY-MM-DD` and `-YYYYMMDD` suffixes fall back to the undated entry."""
    assert TABLE.find("gpt-4o-2024-08-06") == TABLE.find("gpt-4o")
    assert TABLE.find("claude-3-5-sonnet-20241022") == TABLE.find("claude-3-5-sonnet")


def test_no_prefix_matching() -> None:
    """A longer model name never borrows a shorter one's price."""
    table = PriceTable.of({"gpt-4o": Price(input=2.5, output=10.0)})
    assert table.find("gpt-4o-mini") is None
    assert table.cost("gpt-4o-mini", 1000, 1000) == 0.0


def test_reported_model_is_the_fallback() -> None:
    """When the requested name has no price, the provider-reported one is tried."""
    assert TABLE.cost("alias", 1_000_000, 0, reported="gpt-4o-2024-11-20") == pytest.approx(2.5)
    assert TABLE.cost("gpt-4o-mini", 1_000_000, 0, reported="gpt-4o") == pytest.approx(0.15)


def test_negative_prices_are_refused() -> None:
    """A negative price is a configuration error."""

    @dataclass
    class Odd:
        input: float
        output: float

    with pytest.raises(ConfigError, match="bad-model"):
        PriceTable.of({"bad-model": Odd(input=-1.0, output=1.0)})
