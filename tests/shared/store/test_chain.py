"""extend_chain: O(new) extension of a stored prefix-hash chain."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.errors import ConfigError
from shared.hashing import EMPTY, extend_chain, prefix_hashes

texts = st.lists(st.text(max_size=20), max_size=12)


@given(texts, st.integers(min_value=0, max_value=12))
def test_extending_at_any_split_equals_prefix_hashes(contents: list[str], split: int) -> None:
    """Hashing a prefix then extending by the rest gives exactly `prefix_hashes`."""
    msgs = [{"role": "user", "content": c} for c in contents]
    split = min(split, len(msgs))
    head = [EMPTY, *extend_chain(EMPTY, msgs[:split])]
    assert head == prefix_hashes(msgs[:split])
    assert head + extend_chain(head[-1], msgs[split:]) == prefix_hashes(msgs)


@pytest.mark.parametrize("last", ["v1:" + "0" * 32, "v2:abc", "v2:" + "z" * 32, "nonsense"])
def test_foreign_chain_start_is_refused(last: str) -> None:
    """A stored hash of another version (or garbage) is refused rather than extended."""
    with pytest.raises(ConfigError):
        extend_chain(last, [{"role": "user", "content": "x"}])
