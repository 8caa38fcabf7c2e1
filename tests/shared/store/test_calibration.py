"""RedisRatios: the Lua EMA, its clamps, and concurrent updates."""

from __future__ import annotations

import uuid

import pytest

from shared import keys
from shared.calibration import RatioStore, smoothed
from shared.errors import ConfigError
from shared.store import Store
from tests.shared.store.helpers import run_threads

BOUNDS = (0.4, 3.0)


@pytest.fixture
def model() -> str:
    """Ratios are global per model: each test uses a model name of its own."""
    return f"model-{uuid.uuid4().hex[:12]}"


def test_first_observation_sets_then_ema(store: Store, model: str) -> None:
    """No ratio before any observation; the first sets it, the next blends by `smoothing`."""
    assert store.ratios.get(model) is None
    assert store.ratios.update(model, 1.2, 0.3, BOUNDS) == pytest.approx(1.2)
    assert store.ratios.update(model, 2.2, 0.3, BOUNDS) == pytest.approx(1.2 * 0.7 + 2.2 * 0.3)
    assert store.ratios.get(model) == pytest.approx(1.5)


def test_follows_the_shared_update_rule(store: Store, model: str) -> None:
    """Over in- and out-of-bounds observations the Lua matches `calibration.smoothed`."""
    ratios: RatioStore = store.ratios  # the protocol the CalibratedCounter takes
    expected: float | None = None
    for observed in (1.3, 9.0, 0.05, 2.2, 0.9, 3.5, 1.1):
        expected = smoothed(expected, observed, 0.3, BOUNDS)
        assert ratios.update(model, observed, 0.3, BOUNDS) == pytest.approx(expected, rel=1e-12)
    assert ratios.get(model) == pytest.approx(expected, rel=1e-12)


def test_full_precision_survives_the_round_trip(store: Store, model: str) -> None:
    """A ratio with many digits comes back exactly, not truncated by Lua."""
    assert store.ratios.update(model, 1.2345678901234567, 1.0, BOUNDS) == 1.2345678901234567
    assert store.ratios.get(model) == 1.2345678901234567


@pytest.mark.parametrize("observed, expected", [(50.0, 3.0), (0.01, 0.4)])
def test_result_is_clamped_to_bounds(
    store: Store, model: str, observed: float, expected: float
) -> None:
    """Observations far outside the bounds leave the ratio at the nearest bound."""
    assert store.ratios.update(model, observed, 0.3, BOUNDS) == expected
    assert store.ratios.update(model, observed, 0.3, BOUNDS) == pytest.approx(expected)


def test_models_are_separate_and_global(store: Store, model: str) -> None:
    """Each model has its own ratio, under the global namespace; no model is a separate key."""
    store.ratios.update(model, 2.0, 1.0, BOUNDS)
    assert store.ratios.get(model + "-other") is None
    assert store.client.exists(keys.ratio(model))
    assert keys.ratio(model).startswith("prefit:v1:global:")
    assert keys.ratio(None) != keys.ratio(model)


def test_50_concurrent_updates_all_count(store: Store, model: str) -> None:
    """Fifty threads updating at once: every observation is counted and the ratio stays in range."""
    observed = [0.8 + 0.02 * i for i in range(50)]
    run_threads(lambda i: store.ratios.update(model, observed[i], 0.3, BOUNDS), 50)
    cal = store.ratios.calibration(model)
    assert cal is not None
    assert cal.observations == 50
    assert min(observed) <= cal.ratio <= max(observed)


@pytest.mark.parametrize(
    "observed, smoothing, bounds",
    [
        (0.0, 0.3, BOUNDS),
        (float("nan"), 0.3, BOUNDS),
        (1.0, 0.0, BOUNDS),
        (1.0, 1.5, BOUNDS),
        (1.0, 0.3, (3.0, 0.4)),
        (1.0, 0.3, (0.0, 3.0)),
    ],
)
def test_bad_update_is_refused_and_nothing_stored(
    store: Store, model: str, observed: float, smoothing: float, bounds: tuple[float, float]
) -> None:
    """Impossible observations, smoothing or bounds raise ConfigError and store nothing."""
    with pytest.raises(ConfigError):
        store.ratios.update(model, observed, smoothing, bounds)
    assert store.ratios.get(model) is None


def test_model_name_with_whitespace_is_refused(store: Store) -> None:
    """A model name that cannot be a key part is refused."""
    with pytest.raises(ConfigError):
        store.ratios.get("gpt 4")
