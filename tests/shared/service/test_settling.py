"""SettlingRule: what it accepts, how much each observation weighs, impossible settings."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError, ImplausibleObservation
from shared.service.settling import SettlingRule


def test_weights_shrink_to_a_floor() -> None:
    """The n-th observation weighs 1/(n+1) until settled, then 1/(settle_after+1)."""
    rule = SettlingRule(settle_after=4)
    assert [rule.weight(n) for n in range(7)] == [1, 1 / 2, 1 / 3, 1 / 4, 1 / 5, 1 / 5, 1 / 5]


def test_refusals_say_why() -> None:
    """Out of bounds at any time; beyond the tolerance only once settled."""
    rule = SettlingRule(settle_after=3, tolerance=1.5)
    assert "outside the accepted bounds" in (rule.refusal(None, 0, 3.5) or "")
    assert rule.refusal(1.0, 2, 2.0) is None
    assert "more than 1.5x away" in (rule.refusal(1.0, 3, 1.51) or "")
    assert rule.refusal(1.0, 3, 1.5) is None and rule.refusal(1.0, 3, 1 / 1.5) is None
    assert "not a positive number" in (rule.refusal(1.0, 3, float("nan")) or "")
    with pytest.raises(ImplausibleObservation):
        rule.fold(1.0, 3, 0.5)


def test_fold_is_the_mean_then_an_average() -> None:
    """Before settling the ratio is the mean of what was observed."""
    rule = SettlingRule(settle_after=10)
    ratio, seen = None, [1.0, 1.2, 0.8, 1.4]
    for n, x in enumerate(seen):
        ratio = rule.fold(ratio, n, x)
    assert ratio == pytest.approx(sum(seen) / len(seen))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bounds": (1.2, 3.0)},
        {"bounds": (0.0, 3.0)},
        {"settle_after": 0},
        {"settle_after": True},
        {"tolerance": 1.0},
        {"tolerance": float("inf")},
    ],
)
def test_impossible_rules_are_refused(kwargs: dict[str, object]) -> None:
    """Bounds must hold 1, settle_after be a positive integer, tolerance finite and > 1."""
    with pytest.raises(ConfigError):
        SettlingRule(**kwargs)  # type: ignore[arg-type]
