"""The artifact index: what it records, how it folds, shrinks, renders and is stored."""

from __future__ import annotations

import asyncio
import json

from shared.counting.counters import HeuristicCounter
from shared.hashing import prefix_hash
from shared.messages import Message
from shared.summaries.artifacts import (
    COMMAND,
    ERROR,
    FILE,
    HEADER,
    ID,
    MAX_ENTRIES,
    REQUEST,
    URL,
    ArtifactIndex,
    narrative,
)
from shared.summaries.book import SummaryRecord
from shared.summaries.extractive import ExtractiveSummarizer
from shared.summaries.incremental import build_record


def _call(i: int, command: str) -> Message:
    args = json.dumps({"command": command})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": args}}
        ],
    }


def _out(i: int, text: str) -> Message:
    return {"role": "tool", "tool_call_id": f"c{i}", "content": text}


RUN: list[Message] = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the failing test in pkg/core.py, see https://x.org/issue/7"},
    _call(1, "ls pkg"),
    _out(1, "core.py\nhelpers.py\nREADME.md"),
    _call(2, "cat pkg/core.py"),
    _out(2, "def parse_header(raw):\n    return raw"),
    _call(3, "python -m pytest tests/test_core.py"),
    _out(
        3,
        'Traceback (most recent call last):\n  File "tests/test_core.py", line 12, in test_de\n'
        "AssertionError: 'de' is not None\n<returncode>1</returncode>",
    ),
    {
        "role": "assistant",
        "content": "The test fails: parse_header keeps the prefix. Booking ZFA04Y.",
    },
    {"role": "user", "content": "Also keep the old behaviour behind a flag."},
]


def _of(index: ArtifactIndex, kind: str) -> dict[str, str]:
    return {a.value: a.note for a in index.items if a.kind == kind}


def test_records_files_commands_errors_ids_urls_and_requests() -> None:
    """Files listed and read, commands with their end, the error with its place, an id, a URL,
    and the person's requests, verbatim and in order."""
    index = ArtifactIndex().fold(RUN, 0)
    files = _of(index, FILE)
    assert files["pkg/core.py"] == "read" and files["helpers.py"] == "listed"
    commands = _of(index, COMMAND)
    assert commands["python -m pytest tests/test_core.py"].startswith("exit 1")
    assert commands["ls pkg"] == "ok, output"
    errors = _of(index, ERROR)
    assert errors["AssertionError: 'de' is not None"] == "at tests/test_core.py:12"
    assert "ZFA04Y" in _of(index, ID) and "https://x.org/issue/7" in _of(index, URL)
    assert list(_of(index, REQUEST)) == [
        "Fix the failing test in pkg/core.py, see https://x.org/issue/7",
        "Also keep the old behaviour behind a flag.",
    ]
    assert index.upto == len(RUN)


def test_folding_in_parts_equals_folding_at_once() -> None:
    """Folded range by range at turn boundaries (as records are), the index is the one folded
    in one go (counts, latest mention)."""
    whole = ArtifactIndex().fold(RUN, 0)
    parts = ArtifactIndex().fold(RUN[:4], 0).fold(RUN[4:], 4)
    assert parts == whole
    core = next(a for a in whole.items if a.value == "pkg/core.py")
    assert core.count >= 2 and core.first == 1 and core.last == 4


def test_render_keeps_recent_and_frequent_and_says_what_it_dropped() -> None:
    """Over its budget, the index keeps the first and latest request and what was mentioned
    most recently, and says how many items it left out."""
    many = [{"role": "assistant", "content": f"see module_{i}_name"} for i in range(200)]
    index = ArtifactIndex().fold([RUN[1], *many, RUN[-1]], 1)
    shown = index.render(600)
    assert shown.startswith(HEADER) and len(shown) <= 600
    assert "Fix the failing test" in shown and "Also keep the old behaviour" in shown
    assert "module_199_name" in shown and "module_0_name" not in shown
    assert "less recent or rarer items omitted" in shown
    assert index.render(10) == ""


def test_render_leaves_out_what_the_summary_says() -> None:
    """What the summary it is served with already says verbatim is not repeated."""
    index = ArtifactIndex().fold(RUN, 0)
    assert "Also keep the old behaviour behind a flag." not in index.render(
        4000, shown="- Also keep the old behaviour behind a flag."
    )


def test_stored_index_is_capped_and_counts_what_it_lost() -> None:
    """A record holds at most MAX_ENTRIES artifacts; the ones left out are counted."""
    many = [{"role": "assistant", "content": f"name_{i}_x"} for i in range(MAX_ENTRIES + 50)]
    index = ArtifactIndex().fold(many, 0)
    assert len(index.items) == MAX_ENTRIES and index.omitted == 50
    assert any(a.value == f"name_{MAX_ENTRIES + 49}_x" for a in index.items)


def test_record_carries_the_index_and_old_records_stay_readable() -> None:
    """A record's JSON round-trips its index; a record stored before the index had one reads
    as one without it."""
    index = ArtifactIndex().fold(RUN, 0)
    rec = SummaryRecord(len(RUN), prefix_hash(RUN), "text", "extractive", 5, 1.0, index)
    assert SummaryRecord.from_json(rec.to_json()) == rec
    old = '{"upto":3,"prefix_hash":"v2:ab","text":"t","summarizer":"x","tokens":1,"created_at":0}'
    assert SummaryRecord.from_json(old).artifacts is None


def test_build_record_folds_the_index_and_serves_it_after_the_summary() -> None:
    """A record folds the previous record's index; its text is the summary, then the index
    within `index_tokens`; the next record's summarizer sees only the narrative."""
    kwargs = dict(
        start=2, summarizer=ExtractiveSummarizer(), counter=HeuristicCounter(), model=None,
        chunk_tokens=24000, max_summary_tokens=1200, index_tokens=400,
    )  # fmt: skip
    first = asyncio.run(build_record(RUN, cut=6, previous=None, **kwargs)).record  # type: ignore[arg-type]
    second = asyncio.run(build_record(RUN, cut=9, previous=first, **kwargs)).record  # type: ignore[arg-type]
    assert first.artifacts is not None and second.artifacts is not None
    assert HEADER in second.text and "AssertionError: 'de' is not None" in second.text
    assert "pkg/core.py" in second.text and second.artifacts.upto == 9
    assert HEADER not in narrative(second.text) and narrative(first.text) in first.text
    assert {a.value for a in first.artifacts.items} <= {a.value for a in second.artifacts.items}
