"""Prefix hashes, summary records and the book's choice of record."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.hashing import canonical, prefix_hash, prefix_hashes
from shared.summaries.book import SummaryBook, SummaryRecord
from shared.summaries.incremental import summary_message

MSGS = [{"role": "user", "content": f"m{i}"} for i in range(10)]


def test_prefix_hashes_are_one_pass_and_consistent() -> None:
    """prefix_hashes()[k] equals prefix_hash of the first k messages, versioned."""
    chain = prefix_hashes(MSGS)
    assert len(chain) == 11 and all(h.startswith("v2:") for h in chain)
    assert all(chain[k] == prefix_hash(MSGS[:k]) for k in range(11))
    assert len(set(chain)) == 11


def test_hash_is_by_content_not_key_order() -> None:
    """Key order and object identity do not matter; any value change does."""
    a = {"role": "user", "content": "x", "name": "n"}
    b = {"name": "n", "content": "x", "role": "user"}
    assert canonical(a) == canonical(b) and prefix_hash([a]) == prefix_hash([b])
    assert prefix_hash([a]) != prefix_hash([{**a, "content": "y"}])


@given(st.lists(st.text(max_size=5), max_size=8))
def test_record_json_round_trip(texts: list[str]) -> None:
    """Records survive JSON unchanged."""
    rec = SummaryRecord(
        len(texts),
        prefix_hash([{"role": "user", "content": t} for t in texts]),
        "".join(texts),
        "extractive",
        3,
        1.5,
    )
    assert SummaryRecord.from_json(rec.to_json()) == rec


def test_best_prefers_longest_matching_prefix() -> None:
    """The book returns the longest record whose prefix matches by content."""
    chain = prefix_hashes(MSGS)
    short, long_ = SummaryRecord(3, chain[3], "a"), SummaryRecord(7, chain[7], "b")
    wrong = SummaryRecord(9, prefix_hash([{"role": "user", "content": "other"}] * 9), "c")
    book = SummaryBook([short, long_, wrong])
    assert book.best(MSGS) == long_
    assert book.best(MSGS, upto_max=6) == short
    assert book.best(MSGS[:5]) == short
    edited = [MSGS[0], {"role": "user", "content": "changed"}, *MSGS[2:]]
    assert book.best(edited) is None


def test_summary_message_numbers_the_range_as_a_person_counts() -> None:
    """A record with `upto` 112 (exclusive) after a one-message head covers transcript[1:112]:
    its message says "messages 2 to 112", the first and last covered, counted from 1."""
    record = SummaryRecord(112, prefix_hash(MSGS), "text")
    content = summary_message(record, 1)["content"]
    assert content.startswith("[Summary of messages 2 to 112 of this conversation, ")
    assert content.endswith("\ntext")
