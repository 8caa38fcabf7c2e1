"""What a completion cost, from the price table (`PREFIT_PRICES`, USD per million tokens).

Lookup order: the model we asked for, then the model the provider says answered, each
first as written and then without a dated-snapshot suffix (`gpt-4o-2024-08-06` -> `gpt-4o`,
`claude-3-5-sonnet-20241022` -> `claude-3-5-sonnet`). No looser matching: `gpt-4o` must
never price `gpt-4o-mini`. A model with no entry costs 0.0: local servers (vLLM,
Ollama) are free per call, and an unknown price is better reported as zero than guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from shared.errors import ConfigError

_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8})$")
PER = 1_000_000


class PriceLike(Protocol):
    """USD per million input and output tokens (`shared.settings.Price` is one)."""

    @property
    def input(self) -> float: ...

    @property
    def output(self) -> float: ...


@dataclass(frozen=True)
class ModelPrice:
    input: float
    output: float


@dataclass(frozen=True)
class PriceTable:
    """Prices per model name."""

    prices: Mapping[str, ModelPrice]

    @classmethod
    def of(cls, prices: Mapping[str, PriceLike]) -> PriceTable:
        table: dict[str, ModelPrice] = {}
        for model, p in prices.items():
            if p.input < 0 or p.output < 0:
                raise ConfigError(f"price of {model!r} must be >= 0")
            table[model] = ModelPrice(float(p.input), float(p.output))
        return cls(MappingProxyType(table))

    def find(self, model: str | None, *, reported: str | None = None) -> ModelPrice | None:
        """The price for `model` (or the `reported` one), or None when neither has an entry."""
        for name in _candidates(model, reported):
            price = self.prices.get(name)
            if price is not None:
                return price
        return None

    def cost(
        self,
        model: str | None,
        input_tokens: int,
        output_tokens: int,
        *,
        reported: str | None = None,
    ) -> float:
        """USD for one call; 0.0 for a model without a price."""
        price = self.find(model, reported=reported)
        if price is None:
            return 0.0
        return (input_tokens * price.input + output_tokens * price.output) / PER


def _candidates(*models: str | None) -> Iterator[str]:
    for m in models:
        if m:
            yield m
            undated = _SNAPSHOT.sub("", m)
            if undated != m:
                yield undated
