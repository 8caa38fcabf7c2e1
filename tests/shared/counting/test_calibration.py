"""Calibration: smoothed, clamped ratios per model; the service's stricter settling rule."""

from __future__ import annotations

import itertools
import math
import threading
from typing import Any

import pytest

from shared.counting.calibration import (
    NO_MODEL,
    CalibratedCounter,
    MemoryRatios,
    ScaledCounter,
    SettlingRule,
    scale,
    smoothed,
)
from shared.counting.counters import HeuristicCounter
from shared.errors import ConfigError, ImplausibleObservation
from tests.conftest import load_transcript, needs_transcripts, transcript_files

MSGS = [{"role": "user", "content": "x" * 700}, {"role": "assistant", "content": "y" * 350}]


class CountingRatios(MemoryRatios):
    """A MemoryRatios that counts reads, to check how often a slow store would be hit."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get(self, model: str) -> float | None:
        self.reads += 1
        return super().get(model)


def test_unseen_model_has_ratio_one() -> None:
    """Before any observation the ratio is 1.0 and counts equal the base counter's."""
    cal = CalibratedCounter()
    assert isinstance(cal.base, HeuristicCounter)
    assert cal.ratio("gpt-x") == 1.0
    assert cal.count(MSGS, model="gpt-x") == HeuristicCounter().count(MSGS)


def test_first_observation_sets_ratio_then_smooths() -> None:
    """The first observation is taken as is; later ones move the ratio by `smoothing` of the gap."""
    cal = CalibratedCounter(smoothing=0.3)
    assert cal.observe("m", 100, 120) == pytest.approx(1.2)
    assert cal.observe("m", 100, 150) == pytest.approx(0.7 * 1.2 + 0.3 * 1.5)
    assert cal.ratio("m") == pytest.approx(1.29)


def test_converges_to_the_true_ratio() -> None:
    """Repeated observations of one ratio pull the estimate to it geometrically."""
    cal = CalibratedCounter(smoothing=0.3)
    cal.observe("m", 1000, 800)
    gaps = []
    for _ in range(20):
        cal.observe("m", 1000, 1500)
        gaps.append(abs(cal.ratio("m") - 1.5))
    assert all(b < a for a, b in itertools.pairwise(gaps))
    assert gaps[-1] < 1e-3


def test_ratio_is_clamped_to_bounds() -> None:
    """Wild observations stop at the bounds."""
    cal = CalibratedCounter(bounds=(0.5, 2.0))
    assert cal.observe("m", 10, 1000) == 2.0
    assert cal.observe("n", 1000, 10) == 0.5
    seen = [cal.observe("m", 1000, 1) for _ in range(40)]
    assert all(0.5 <= r <= 2.0 for r in seen)
    assert cal.ratio("m") == pytest.approx(0.5, abs=1e-4)


def test_models_are_calibrated_separately() -> None:
    """Observing one model leaves other models, and the model-less default, alone."""
    cal = CalibratedCounter()
    cal.observe("a", 100, 200)
    assert cal.ratio("a") == 2.0
    assert cal.ratio("b") == 1.0
    assert cal.ratio(None) == 1.0
    cal.observe(None, 100, 50)
    assert cal.ratios.get(NO_MODEL) == 0.5
    assert cal.ratio("a") == 2.0


def test_count_scales_the_base_estimate() -> None:
    """count, count_message and count_tools are ceil(ratio x base)."""
    base = HeuristicCounter()
    cal = CalibratedCounter(base)
    cal.observe("m", 3, 4)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert cal.count(MSGS, tools, model="m") == math.ceil(base.count(MSGS, tools) * 4 / 3)
    assert cal.count_message(MSGS[0], model="m") == math.ceil(base.count_message(MSGS[0]) * 4 / 3)
    assert cal.count_tools(tools, model="m") == math.ceil(base.count_tools(tools) * 4 / 3)


def test_scale_has_no_float_noise() -> None:
    """An exact product is not bumped up by float error (1.1 x 100 is 110, not 111)."""
    assert scale(1.1, 100) == 110
    assert scale(1.5, 3) == 5
    assert scale(1.0, 7) == 7


def test_one_store_read_per_count() -> None:
    """Each count reads the ratio once; a scaled() snapshot reads it once for many counts."""
    ratios = CountingRatios()
    cal = CalibratedCounter(ratios=ratios)
    cal.observe("m", 10, 20)
    cal.count(MSGS, model="m")
    assert ratios.reads == 1
    snapshot = cal.scaled("m")
    assert isinstance(snapshot, ScaledCounter)
    assert ratios.reads == 2
    before = snapshot.count(MSGS)
    cal.observe("m", 10, 5)
    assert snapshot.count(MSGS) == before == math.ceil(2 * cal.base.count(MSGS))
    assert [snapshot.count_message(m) for m in MSGS] and ratios.reads == 2


@pytest.mark.parametrize(("estimated", "actual"), [(0, 10), (10, 0), (-5, 10), (True, 3), (1.5, 3)])
def test_observe_rejects_impossible_measurements(estimated: Any, actual: Any) -> None:
    """Non-positive or non-integer counts raise ConfigError and change nothing."""
    cal = CalibratedCounter()
    cal.observe("m", 100, 130)
    with pytest.raises(ConfigError):
        cal.observe("m", estimated, actual)
    assert cal.ratio("m") == pytest.approx(1.3)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"smoothing": 0},
        {"smoothing": 1.5},
        {"smoothing": float("nan")},
        {"bounds": (0, 2)},
        {"bounds": (1.2, 3)},
        {"bounds": (0.5, 0.9)},
        {"bounds": (3.0, 0.4)},
        {"bounds": (0.5,)},
        {"bounds": (0.5, float("inf"))},
    ],
)
def test_constructor_rejects_impossible_settings(kwargs: dict[str, Any]) -> None:
    """smoothing outside (0, 1] or bounds not around 1.0 raise ConfigError."""
    with pytest.raises(ConfigError):
        CalibratedCounter(**kwargs)


def test_smoothed_is_the_documented_rule() -> None:
    """The shared update rule: clamp, take the first as is, then an exponential average, clamped."""
    assert smoothed(None, 5.0, 0.3, (0.4, 3.0)) == 3.0
    assert smoothed(None, 1.2, 0.3, (0.4, 3.0)) == 1.2
    assert smoothed(2.0, 1.0, 0.25, (0.4, 3.0)) == 0.75 * 2.0 + 0.25 * 1.0
    assert smoothed(2.9, 10.0, 0.5, (0.4, 3.0)) == 0.5 * 2.9 + 0.5 * 3.0


def test_memory_ratios_forget_the_least_recent_model() -> None:
    """MemoryRatios holds at most max_models models, dropping the least recently updated."""
    store = MemoryRatios(max_models=2)
    for model in ("a", "b", "a", "c"):
        store.update(model, 1.5, 0.3, (0.4, 3.0))
    assert store.get("b") is None
    assert store.get("a") is not None and store.get("c") == 1.5
    with pytest.raises(ConfigError):
        MemoryRatios(max_models=0)


def test_memory_ratios_updates_are_atomic() -> None:
    """Concurrent updates of a constant ratio leave exactly that ratio and lose no model."""
    store = MemoryRatios()

    def work(t: int) -> None:
        for i in range(500):
            store.update(f"m{i % 10}", 1.25, 0.3, (0.4, 3.0))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert [store.get(f"m{i}") for i in range(10)] == [1.25] * 10


@needs_transcripts
def test_calibration_reduces_error_on_real_usage() -> None:
    """Fed half of each Gemini run's real prompt counts, the rest are estimated closer."""
    raw_err, cal_err = [], []
    for path in transcript_files():
        data = load_transcript(path)
        usage = data["meta"].get("usage")
        if not usage or not path.name.startswith("mswea_"):
            continue
        msgs, base = data["messages"], HeuristicCounter()
        cal = CalibratedCounter(base)
        half = len(usage) // 2
        for u in usage[:half]:
            cal.observe("gemini", base.count(msgs[: u["message_index"]]), u["prompt_tokens"])
        for u in usage[half:]:
            prefix, actual = msgs[: u["message_index"]], u["prompt_tokens"]
            raw_err.append(abs(base.count(prefix) - actual) / actual)
            cal_err.append(abs(cal.count(prefix, model="gemini") - actual) / actual)
    assert len(raw_err) > 100
    assert sum(cal_err) < 0.6 * sum(raw_err)


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
