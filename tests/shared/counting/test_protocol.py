"""A counter written from the reference (only `count`) works everywhere a counter goes."""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.counting import encodings
from shared.counting.calibration import CalibratedCounter
from shared.counting.counters import HeuristicCounter, TiktokenCounter
from shared.counting.protocol import CountOnly, MessageCounter, per_message
from shared.errors import ConfigError, DoesNotFit
from shared.messages import Message, ToolSpec
from shared.policy import ContextPolicy
from shared.settings import get_settings
from tests.builders import wordy_chat
from tests.shared.generated import transcripts
from tests.shared.invariants import assert_justified, check

pytestmark = pytest.mark.anyio


class WordCounter:
    """Counts words plus 3 per message and 2 per request: only `count`, as the reference
    defines the protocol."""

    def __init__(self) -> None:
        self.calls = 0

    def count(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), model: str | None = None
    ) -> int:
        self.calls += 1
        words = sum(len(str(m.get("content") or "").split()) + 3 for m in messages)
        return words + sum(len(str(t).split()) for t in tools) + 2


def test_sizes_derive_from_count_and_are_cached_by_content() -> None:
    """count_message = count([m]) - count([]); a message counted once costs no more calls."""
    inner = WordCounter()
    counter = per_message(inner)
    assert isinstance(counter, CountOnly) and isinstance(counter, MessageCounter)
    m = {"role": "user", "content": "one two three"}
    assert counter.count_message(m) == 6
    calls = inner.calls
    assert counter.count_message(dict(m)) == 6 and inner.calls == calls
    assert counter.count_tools([{"name": "a b"}]) == 3  # "{'name':", "'a", "b'}"
    assert counter.count([m]) == inner.count([m])
    assert per_message(HeuristicCounter()).__class__ is HeuristicCounter


async def test_policy_and_calibration_accept_a_count_only_counter() -> None:
    """ContextPolicy(counter=...) and CalibratedCounter(...) both work with it, and fit by it."""
    inner = WordCounter()
    msgs = wordy_chat(40)
    for counter in (inner, CalibratedCounter(inner)):
        policy = ContextPolicy(3_000, counter=counter, reserve_output=500)
        out = await policy.prepare(msgs)
        assert inner.count(out.messages) <= policy.budget(None)
        check(policy, msgs, out, counter=inner)
    calibrated = CalibratedCounter(inner)
    calibrated.observe(None, 1000, 1500)
    raw = per_message(inner).count_message(msgs[1])
    assert calibrated.count_message(msgs[1]) == math.ceil(1.5 * raw)


def test_a_counter_without_count_is_refused() -> None:
    """Something with no count() is a configuration error, said at construction."""
    with pytest.raises(ConfigError, match="count"):
        ContextPolicy(8_000, counter=object())  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transcripts(max_groups=30), st.integers(1_500, 30_000))
async def test_invariants_with_a_count_only_counter(msgs: list[Message], window: int) -> None:
    """Generated transcripts fit by the count-only counter's own measure."""
    inner = WordCounter()
    policy = ContextPolicy(window + 500, counter=inner, reserve_output=500)
    try:
        out = await policy.prepare(msgs)
    except DoesNotFit as e:
        assert_justified(e)
        return
    check(policy, msgs, out, counter=inner)


@pytest.fixture
def fresh_encodings() -> Iterator[None]:
    """Settings and loaded encodings forgotten before and after (they are per process)."""
    saved = dict(encodings._loaded)
    encodings._loaded.clear()
    get_settings.cache_clear()
    yield
    encodings._loaded.clear()
    encodings._loaded.update(saved)
    get_settings.cache_clear()


class EndpointCounter:
    """Like a provider's count-tokens endpoint or a chat template: it refuses no messages
    and a conversation that does not open with a user message."""

    def count(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), model: str | None = None
    ) -> float:
        if not messages or messages[0]["role"] not in ("system", "user"):
            raise ValueError("the first message must be a user message")
        return 0.5 + sum(len(str(m.get("content") or "")) / 4 for m in messages)


def test_a_count_only_counter_that_refuses_no_messages() -> None:
    """A counter that cannot count no messages gets no per-request base (it over-counts),
    fractional counts round up, and one that cannot count a message alone is a ConfigError
    saying so, not its own exception."""
    counter = per_message(EndpointCounter())
    user = {"role": "user", "content": "x" * 40}
    assert counter.count_message(user) == 11 and counter.count([user]) == 11
    with pytest.raises(ConfigError, match="on its own"):
        counter.count_message({"role": "assistant", "content": "hi"})


def test_a_count_that_is_not_a_number_is_a_config_error() -> None:
    """A count that is not a number >= 0 (here negative) is refused, typed."""

    class Negative:
        def count(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (),
                  model: str | None = None) -> int:  # fmt: skip
            return -1

    with pytest.raises(ConfigError, match="must return a number"):
        per_message(Negative()).count([{"role": "user", "content": "hi"}])


def test_tiktoken_counter_finds_prefit_tiktoken_dir(
    tiktoken_dir: Path, fresh_encodings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TiktokenCounter() with no folder given reads PREFIT_TIKTOKEN_DIR, no network needed."""
    monkeypatch.setenv("PREFIT_TIKTOKEN_DIR", str(tiktoken_dir))
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    assert TiktokenCounter().tokens("hello world") == 2


def test_tiktoken_counter_finds_tiktoken_cache_dir(
    tiktoken_dir: Path, tmp_path: Path, fresh_encodings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files named as tiktoken's own cache names them (SHA-1 of the URL) are found too."""
    url = encodings.SPECS["o200k_base"].url
    os.symlink(
        tiktoken_dir / "o200k_base.tiktoken", tmp_path / hashlib.sha1(url.encode()).hexdigest()
    )
    monkeypatch.delenv("PREFIT_TIKTOKEN_DIR", raising=False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert TiktokenCounter().tokens("hello world") == 2
