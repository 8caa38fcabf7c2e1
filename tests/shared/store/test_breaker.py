"""The summarizer breaker: open on a permanent failure, one probe after the pause, doubling."""

from __future__ import annotations

import time
import uuid

from pydantic import SecretStr

from shared.settings import Settings
from shared.store import Breakers, Store, keys
from shared.store.breaker import overall, provider_id, provider_label
from tests.shared.store.helpers import run_threads

BASE, MAX = 0.2, 0.5


def _breakers(store: Store) -> tuple[Breakers, str]:
    return Breakers(store.client, base_s=BASE, max_s=MAX), f"p{uuid.uuid4().hex[:12]}"


def test_a_permanent_failure_opens_it_and_only_one_probe_follows_the_pause(
    store: Store,
) -> None:
    """Open for the base pause; then half-open, and of ten jobs exactly one may probe."""
    breakers, provider = _breakers(store)
    assert breakers.state(provider).state == "closed"
    state, opened = breakers.trip(provider, "openai:m", "LLMError: HTTP 401")
    assert opened and state.state == "open" and state.failures == 1
    assert breakers.state(provider).state == "open"
    assert not breakers.probe(provider, 5.0)  # nobody calls while open
    time.sleep(BASE + 0.05)
    assert breakers.state(provider).state == "half_open"
    assert run_threads(lambda i: breakers.probe(provider, 5.0), 10).count(True) == 1


def test_failures_while_open_do_not_lengthen_the_pause(store: Store) -> None:
    """Fifty calls in flight failing after it opened: still one failure, the base pause."""
    # a pause longer than fifty calls take on a loaded machine: all of them fail while it is
    # open (with 0.2 s, late calls found it half-open and were a second, rightful, opening)
    breakers, provider = Breakers(store.client, base_s=5.0, max_s=10.0), f"p{uuid.uuid4().hex[:12]}"
    results = run_threads(lambda i: breakers.trip(provider, "l", "LLMError"), 50)
    assert [opened for _, opened in results].count(True) == 1  # type: ignore[misc]
    assert breakers.state(provider).failures == 1


def test_each_failed_probe_doubles_the_pause_up_to_the_max(store: Store) -> None:
    """Pauses of 0.2 s, 0.4 s, then 0.5 s (the max); a successful probe closes it."""
    breakers, provider = _breakers(store)
    pauses = []
    for _ in range(3):
        before = time.time()
        state, opened = breakers.trip(provider, "l", "LLMError")
        assert opened and state.until is not None
        pauses.append(round(state.until - before, 1))
        time.sleep(state.until - time.time() + 0.02)
        assert breakers.probe(provider, 5.0)  # the probe goes, and fails again (next trip)
    assert pauses == [0.2, 0.4, 0.5]
    breakers.reset(provider)
    assert breakers.state(provider).state == "closed"


def test_a_released_probe_lets_another_job_try(store: Store) -> None:
    """A probe that ended in a retryable error hands the probe on at once."""
    breakers, provider = _breakers(store)
    breakers.trip(provider, "l", "LLMError")
    time.sleep(BASE + 0.05)
    assert breakers.probe(provider, 60.0) and not breakers.probe(provider, 60.0)
    breakers.release_probe(provider)
    assert breakers.probe(provider, 60.0)


def test_every_tripped_configuration_is_listed_with_its_state(store: Store) -> None:
    """`all()` (for /readyz and /metrics) names each configuration by label; worst first."""
    breakers, provider = _breakers(store)
    label = f"openai:{provider}"
    breakers.trip(provider, label, "LLMError: HTTP 401")
    states = {s.label: s for s in breakers.all()}
    assert states[label].state == "open" and states[label].failures == 1
    detail = overall([states[label]])
    assert detail["state"] == "open" and detail["until"] == states[label].until
    assert overall([])["state"] == "closed"
    raw = store.client.hgetall(keys.breaker(provider))
    assert b"401" in raw[b"error"]


def test_each_provider_configuration_has_its_own_breaker_and_no_secret_in_it() -> None:
    """A new key, model or URL gets a breaker of its own; neither key nor URL leaks into it."""
    base = {"summarizer_url": "https://llm.example/v1", "summarizer_model": "m1"}
    one = Settings(**base, summarizer_api_key=SecretStr("sk-one"))
    ids = {
        provider_id(one),
        provider_id(Settings(**base, summarizer_api_key=SecretStr("sk-two"))),
        provider_id(Settings(**{**base, "summarizer_model": "m2"})),
        provider_id(Settings(**{**base, "summarizer_url": "https://other.example/v1"})),
    }
    assert len(ids) == 4 and None not in ids
    assert provider_id(Settings(summarizer_url=None)) is None  # the offline summarizer
    assert provider_id(one) == provider_id(Settings(**base, summarizer_api_key=SecretStr("sk-one")))
    assert "sk-one" not in keys.breaker(str(provider_id(one)))
    assert provider_label(one) == "openai:m1"
