"""RedisRatios: per tenant and model, the settling rule in Lua, refusals, expiry, concurrency."""

from __future__ import annotations

import random
import uuid

import pytest

from shared.counting.calibration import CalibratedCounter, SettlingRule
from shared.counting.counters import HeuristicCounter
from shared.errors import ImplausibleObservation
from shared.store import Calibration, Store, keys
from shared.store.calibration import RedisRatios
from tests.conftest import RETENTION_S
from tests.redisbackend import store_client
from tests.shared.store.helpers import run_threads


@pytest.fixture
def model() -> str:
    """Each test uses a model name of its own."""
    return f"model-{uuid.uuid4().hex[:12]}"


def test_first_observation_sets_then_the_mean(store: Store, tenant: str, model: str) -> None:
    """No ratio before any observation; the first sets it, the next ones average in."""
    assert store.ratios.get(tenant, model) is None
    assert store.ratios.observe(tenant, model, 1.2) == pytest.approx(1.2)
    assert store.ratios.observe(tenant, model, 1.5) == pytest.approx(1.35)
    assert store.ratios.observe(tenant, model, 0.9) == pytest.approx(1.2)
    cal = store.ratios.calibration(tenant, model)
    assert cal is not None and cal.observations == 3 and cal.ratio == pytest.approx(1.2)


def test_lua_follows_the_rule_exactly(store: Store, tenant: str, model: str) -> None:
    """Over 300 observations, near and far, the Lua gives `SettlingRule.fold`'s doubles and
    refuses exactly what it refuses."""
    rule = store.ratios.rule
    rng = random.Random(7)
    current: float | None = None
    n = 0
    for _ in range(300):
        observed = rng.choice([rng.uniform(0.8, 1.3), rng.uniform(0.1, 6.0)])
        try:
            expected: float | None = rule.fold(current, n, observed)
        except ImplausibleObservation:
            expected = None
        if expected is None:
            with pytest.raises(ImplausibleObservation):
                store.ratios.observe(tenant, model, observed)
        else:
            assert store.ratios.observe(tenant, model, observed) == expected
            current, n = expected, n + 1
    assert n > 100 and current is not None
    assert store.ratios.calibration(tenant, model) == Calibration(current, n)


@pytest.mark.parametrize("observed", [0.39, 3.01, 50.0, 0.01])
def test_out_of_bounds_is_refused_and_stores_nothing(
    store: Store, tenant: str, model: str, observed: float
) -> None:
    """An observation outside (0.4, 3.0) is refused with the reason, even the first one."""
    with pytest.raises(ImplausibleObservation, match="outside the accepted bounds"):
        store.ratios.observe(tenant, model, observed)
    assert store.ratios.calibration(tenant, model) is None
    assert not store.client.exists(keys.ratio(tenant, model))


def test_far_from_a_settled_ratio_is_refused(redis_url: str, tenant: str, model: str) -> None:
    """Once settled, an observation beyond the tolerance is refused and changes nothing."""
    client = store_client(redis_url)
    ratios = RedisRatios(client, retention_s=60, rule=SettlingRule(settle_after=5, tolerance=1.2))
    for _ in range(4):
        ratios.observe(tenant, model, 1.0)
    assert ratios.observe(tenant, model, 1.5) == pytest.approx(1.1)  # not settled yet
    before = ratios.calibration(tenant, model)
    with pytest.raises(ImplausibleObservation, match=r"more than 1.2x away from the settled"):
        ratios.observe(tenant, model, 1.5)
    with pytest.raises(ImplausibleObservation):
        ratios.observe(tenant, model, 0.9)
    assert ratios.calibration(tenant, model) == before
    assert ratios.observe(tenant, model, 1.2) == pytest.approx(1.1 + (1.2 - 1.1) / 6)
    client.close()


def test_five_wrong_reports_barely_move_a_settled_ratio(
    store: Store, tenant: str, model: str
) -> None:
    """With the defaults, 5 reports 1.49x off move a settled ratio < 2.5%; 5x off are refused."""
    for _ in range(store.ratios.rule.settle_after):
        store.ratios.observe(tenant, model, 1.1)
    settled = store.ratios.get(tenant, model)
    assert settled == pytest.approx(1.1)
    for _ in range(5):
        with pytest.raises(ImplausibleObservation):
            store.ratios.observe(tenant, model, 1.1 * 5)
    assert store.ratios.get(tenant, model) == settled
    for _ in range(5):
        store.ratios.observe(tenant, model, 1.1 * 1.49)
    moved = store.ratios.get(tenant, model)
    assert moved is not None and 1.0 < moved / 1.1 < 1.025


def test_tenants_are_separate(store: Store, tenant: str, model: str) -> None:
    """Another tenant's observations of the same model never change this tenant's ratio."""
    other = f"{tenant}-b"
    store.ratios.observe(tenant, model, 1.1)
    for _ in range(20):
        store.ratios.observe(other, model, 2.9)
    assert store.ratios.get(tenant, model) == pytest.approx(1.1)
    assert keys.ratio(tenant, model) != keys.ratio(other, model)
    assert keys.ratio(tenant, model).startswith(f"{keys.ROOT}:{{{tenant}}}:")


@pytest.mark.parametrize("name", ["gpt 4o", "x:y*{z}", "é", "a" * 300, "\n", "}{"])
def test_any_model_name_makes_a_safe_distinct_key(store: Store, tenant: str, name: str) -> None:
    """Names outside [A-Za-z0-9._/-] become a digest: no braces, spaces or ':' in the key."""
    key = keys.ratio(tenant, name)
    suffix = key.removeprefix(f"{keys.ROOT}:{{{tenant}}}:ratio:")
    assert suffix.startswith("~") and len(suffix) == 33
    assert key != keys.ratio(tenant, name + "x") != keys.ratio(tenant, "gpt-4o")
    store.ratios.observe(tenant, name, 1.3)
    assert store.ratios.get(tenant, name) == pytest.approx(1.3)
    assert keys.ratio(tenant, "openai/gpt-4o.1_x-y").endswith(":ratio:openai/gpt-4o.1_x-y")


def test_ratio_keys_expire_and_updates_refresh_them(store: Store, tenant: str, model: str) -> None:
    """A ratio key carries the calibration retention, set again by every accepted update."""
    store.ratios.observe(tenant, model, 1.0)
    key = keys.ratio(tenant, model)
    store.client.pexpire(key, 5000)
    store.ratios.observe(tenant, model, 1.0)
    ttl = store.client.pttl(key)
    retention_ms = store.ratios._ttl
    assert retention_ms > RETENTION_S * 1000 and retention_ms - 5000 < ttl <= retention_ms


def test_50_concurrent_updates_all_count(store: Store, tenant: str, model: str) -> None:
    """Fifty threads observing at once: every observation is counted, the ratio in range."""
    observed = [0.8 + 0.01 * i for i in range(50)]
    run_threads(lambda i: store.ratios.observe(tenant, model, observed[i]), 50)
    cal = store.ratios.calibration(tenant, model)
    assert cal is not None
    assert cal.observations == 50
    assert cal.ratio == pytest.approx(sum(observed) / 50)


def test_a_calibrated_counter_on_a_tenant_uses_the_rule(
    store: Store, tenant: str, model: str
) -> None:
    """`of(tenant)` is a RatioStore: a CalibratedCounter observes and counts through it."""
    counter = CalibratedCounter(HeuristicCounter(), ratios=store.ratios.of(tenant))
    assert counter.observe(model, 100, 120) == pytest.approx(1.2)
    assert counter.observe(model, 100, 140) == pytest.approx(1.3)  # the mean, not the EMA
    with pytest.raises(ImplausibleObservation):
        counter.observe(model, 100, 500)
    assert counter.ratio(model) == pytest.approx(1.3)
