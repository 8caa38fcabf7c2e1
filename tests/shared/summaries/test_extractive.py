"""The offline extractive summarizer: what it keeps, its size bound, folding, determinism."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.errors import ConfigError
from shared.head import head_end
from shared.messages import Message
from shared.summaries.extractive import EMPTY, ExtractiveSummarizer
from tests.builders import tool_call
from tests.conftest import load_transcript, needs_transcripts, transcript_files
from tests.shared import aider

pytestmark = pytest.mark.anyio

AGENT_RUN: list[Message] = [
    {
        "role": "user",
        "content": "The parser crashes on empty input. Please fix it and add a test. Thanks!",
    },
    {
        "role": "assistant",
        "content": "THOUGHT: Let me look at the parser first.\nMore reasoning here.",
        "tool_calls": [tool_call("c1", "bash", {"command": "cat src/parser/core.py"})],
    },
    {
        "role": "tool",
        "tool_call_id": "c1",
        "content": "def parse(text):\n    raise ValueError('x')\n",
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [tool_call("c2", "bash", {"command": "pytest tests/test_parser.py -x"})],
    },
    {
        "role": "tool",
        "tool_call_id": "c2",
        "content": (
            "collected 3 items\n"
            'File "/repo/src/parser/core.py", line 2, in parse\n'
            "E   IndexError: list index out of range\n"
            "FAILED tests/test_parser.py::test_empty - IndexError\n"
            "1 failed, 2 passed in 0.12s"
        ),
    },
    {"role": "assistant", "content": "I will guard the empty case in `src/parser/core.py`."},
]


def summarize(
    previous: str | None, messages: list[Message], max_tokens: int = 1000, **kw: Any
) -> str:
    return ExtractiveSummarizer(**kw).summarize_now(previous, messages, max_tokens=max_tokens).text


def section(text: str, name: str) -> list[str]:
    """The items of one section of a rendered summary."""
    lines = text.splitlines()
    if f"{name}:" not in lines:
        return []
    out = []
    for line in lines[lines.index(f"{name}:") + 1 :]:
        if not line.startswith("- "):
            break
        out.append(line[2:])
    return out


def test_sections_keep_requests_actions_files_errors() -> None:
    """Requests, first lines, tool calls, paths and error lines each land in their section."""
    text = summarize(None, AGENT_RUN)
    assert section(text, "Task/requests") == [
        "The parser crashes on empty input. Please fix it and add a test. Thanks!"
    ]
    actions = section(text, "Actions")
    assert actions == [
        "THOUGHT: Let me look at the parser first.",
        'bash(command="cat src/parser/core.py")',
        'bash(command="pytest tests/test_parser.py -x")',
        "I will guard the empty case in `src/parser/core.py`.",
    ]
    files = section(text, "Files")
    assert "src/parser/core.py" not in files  # /repo/src/parser/core.py is the longer form
    assert set(files) == {"tests/test_parser.py", "/repo/src/parser/core.py"}
    errors = section(text, "Errors/open items")
    assert errors == [
        "bash: E IndexError: list index out of range",
        "bash: FAILED tests/test_parser.py::test_empty - IndexError",
        "bash: 1 failed, 2 passed in 0.12s",
    ]


def test_requests_are_kept_verbatim_on_one_line() -> None:
    """The person's words stay whole (markup tags dropped), up to `max_request_chars`."""
    first = "Consider the following PR description about the ITRS to observed transformations."
    content = f"<pr_description>\n{first}\nIt is long.\n\nMore details follow.</pr_description>"
    assert section(summarize(None, [{"role": "user", "content": content}]), "Task/requests") == [
        f"{first} It is long. More details follow."
    ]
    long = [{"role": "user", "content": "word " * 400}]
    [item] = section(summarize(None, long, max_request_chars=300), "Task/requests")
    assert len(item) == 300 and item.endswith("…")


def test_context_a_client_hands_over_is_not_a_request() -> None:
    """A user message answered "Ok." before the next one (aider's file listings and its
    "I updated the files.") is not among the requests; system messages keep a sentence."""
    messages = aider.edit_turns()
    messages.insert(3, {"role": "system", "content": "Stay terse. Always."})
    assert section(summarize(None, messages), "Task/requests") == [
        "Rename foo to bar in a.py",
        "system: Stay terse. Always.",
        "Now run the tests",
    ]


def test_the_persons_first_and_latest_messages_outlast_everything() -> None:
    """Over budget the other sections lose items first; the requests keep their share, and
    their first and latest always stay, the marker after the first."""
    noisy = [m for k in range(30) for m in AGENT_RUN[1:]]
    messages: list[Message] = [
        {"role": "user", "content": "FIRST: migrate the store to Redis streams."},
        *noisy,
        *[{"role": "user", "content": f"Also request {i}, please do it."} for i in range(30)],
        {"role": "user", "content": "LATEST: stop and write the changelog."},
    ]
    for max_tokens in (30, 80, 200):
        text = summarize(None, messages, max_tokens=max_tokens)
        items = section(text, "Task/requests")
        assert items[0].startswith("FIRST:") and items[-1].startswith("LATEST:"), max_tokens
        assert items[1].endswith("earlier items omitted)") and len(text) <= max_tokens * 4
        if max_tokens >= 80:  # room for them whole
            assert items[0] == "FIRST: migrate the store to Redis streams."
            assert items[-1] == "LATEST: stop and write the changelog."
    roomy = summarize(None, messages, max_tokens=200)
    assert len(section(roomy, "Task/requests")) > 10  # their share of the budget
    assert len(section(roomy, "Actions")) < 30


async def test_completion_accounting() -> None:
    """No input tokens, output tokens estimated at 4 characters each, no cost."""
    done = await ExtractiveSummarizer().summarize(None, AGENT_RUN, max_tokens=500)
    assert done.input_tokens == 0
    assert done.output_tokens == math.ceil(len(done.text) / 4)
    assert done.cost == 0.0
    assert ExtractiveSummarizer.name == "extractive"


def test_deterministic() -> None:
    """The same input gives the same output, across instances and calls."""
    first = summarize(None, AGENT_RUN, max_tokens=60)
    assert summarize(None, AGENT_RUN, max_tokens=60) == first
    assert summarize(first, AGENT_RUN[2:], max_tokens=60) == summarize(
        first, AGENT_RUN[2:], max_tokens=60
    )


@pytest.mark.parametrize("max_tokens", [1, 5, 20, 50, 100, 400])
def test_respects_max_tokens(max_tokens: int) -> None:
    """The text never exceeds max_tokens x 4 characters."""
    long_run = AGENT_RUN * 30
    assert len(summarize(None, long_run, max_tokens=max_tokens)) <= max_tokens * 4


def test_trimming_drops_oldest_and_says_how_many() -> None:
    """Over budget, the oldest items go first (the first request aside): a marker counts them."""
    messages: list[Message] = [
        {"role": "user", "content": f"Request number {i}."} for i in range(50)
    ]
    text = summarize(None, messages, max_tokens=60)
    items = section(text, "Task/requests")
    assert items[0] == "Request number 0."  # the first request is never omitted
    assert items[1].startswith("(") and items[1].endswith(" earlier items omitted)")
    omitted = int(items[1][1:].split()[0])
    assert items[2:] == [f"Request number {i}." for i in range(omitted + 1, 50)]
    assert items[-1] == "Request number 49."


def test_folds_the_previous_summary_first() -> None:
    """The previous summary's items come before the new range's, none lost while in budget."""
    previous = summarize(None, AGENT_RUN[:3])
    more: list[Message] = [
        {"role": "user", "content": "Also update docs/parser.md please."},
        {"role": "assistant", "content": "Done: docs/parser.md updated."},
    ]
    text = summarize(previous, more)
    assert section(text, "Task/requests") == [
        "The parser crashes on empty input. Please fix it and add a test. Thanks!",
        "Also update docs/parser.md please.",
    ]
    assert section(text, "Actions")[:2] == section(previous, "Actions")
    assert section(text, "Files") == ["src/parser/core.py", "docs/parser.md"]


def test_repeated_items_move_to_their_latest_place() -> None:
    """An item seen again is kept once, where it was last seen."""
    previous = "Files:\n- a/b.py\n- c/d.py"
    text = summarize(previous, [{"role": "user", "content": "Look at a/b.py again."}])
    assert section(text, "Files") == ["c/d.py", "a/b.py"]


def test_omitted_counts_accumulate_across_folds() -> None:
    """A previous "(N earlier items omitted)" marker is carried and added to."""
    previous = "Task/requests:\n- (7 earlier items omitted)\n- Old request."
    messages: list[Message] = [
        {"role": "user", "content": f"Request number {i}."} for i in range(40)
    ]
    text = summarize(previous, messages, max_tokens=40)
    first, marker = section(text, "Task/requests")[:2]
    assert first == "Old request."
    assert int(marker[1:].split()[0]) > 7 + 1


def test_foreign_previous_summary_is_kept_as_earlier() -> None:
    """A previous summary by another writer (an LLM's prose) is kept line by line under Earlier."""
    previous = "The user asked for a parser fix.\n\nWe found the bug in the tokenizer."
    text = summarize(previous, AGENT_RUN[:1])
    assert text.startswith("Earlier:\n")
    assert section(text, "Earlier") == [
        "The user asked for a parser fix.",
        "We found the bug in the tokenizer.",
    ]


def test_own_output_round_trips() -> None:
    """Folding a summary with nothing new gives the summary back."""
    text = summarize(None, AGENT_RUN)
    assert summarize(text, []) == text


def test_nothing_to_say() -> None:
    """No previous summary and nothing notable gives a fixed placeholder."""
    assert summarize(None, []) == EMPTY
    assert summarize(None, [{"role": "assistant", "content": ""}]) == EMPTY
    assert summarize(None, [{"role": "user", "content": "<br/> <p></p>"}]) == EMPTY


def test_no_false_errors() -> None:
    """Empty JSON error fields, file names with "error", and source code are not failures."""
    outputs = [
        '{"error": "", "response": "[{\\"id\\": 1}]"}',
        "errors.py\ntest_error.py\nutils.py",
        "    raise ValueError('bad')\n    except KeyError:\n12:    raise TypeError('x')",
        "<returncode>0</returncode>\n<output>ok</output>",
    ]
    messages: list[Message] = [
        {"role": "assistant", "content": None, "tool_calls": [tool_call("t", "run", {})]},
        *({"role": "tool", "tool_call_id": "t", "content": out} for out in outputs),
    ]
    assert section(summarize(None, messages), "Errors/open items") == []


def test_nonzero_return_code_is_an_error() -> None:
    """A non-zero return code is reported, named by its tool."""
    messages: list[Message] = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call("t", "bash", {"command": "make"})],
        },
        {
            "role": "tool",
            "tool_call_id": "t",
            "name": "shell",
            "content": "<returncode>2</returncode>",
        },
    ]
    assert section(summarize(None, messages), "Errors/open items") == [
        "shell: <returncode>2</returncode>"
    ]


def test_paths_but_not_prose_or_urls() -> None:
    """Paths are found; "and/or", "e.g.", versions and URLs are not paths."""
    text = (
        "Edit ./setup.cfg and /etc/hosts, see lib/x/y and README.md, e.g. and/or I/O v1.2 "
        "at https://example.com/a/b.html or mail me@host.org."
    )
    files = section(
        summarize(None, [{"role": "user", "content": "x"}, {"role": "assistant", "content": text}]),
        "Files",
    )
    assert files == ["./setup.cfg", "/etc/hosts", "lib/x/y", "README.md"]


def test_tool_call_arguments_are_abridged() -> None:
    """Long arguments are cut, each value and the whole call alike."""
    big = {"path": "src/big.py", "content": "x" * 5000}
    messages: list[Message] = [
        {"role": "assistant", "content": None, "tool_calls": [tool_call("w", "write_file", big)]}
    ]
    action = section(summarize(None, messages, max_chars_per_message=120), "Actions")[0]
    assert action.startswith('write_file(path="src/big.py", content="xxx')
    assert len(action) <= 120
    assert "x" * 90 not in action and "…" in action


def test_bad_arguments() -> None:
    """max_tokens below 1 and a tiny per-message limit are configuration errors."""
    with pytest.raises(ConfigError, match="max_tokens"):
        ExtractiveSummarizer().summarize_now(None, AGENT_RUN, max_tokens=0)
    with pytest.raises(ConfigError, match="max_chars_per_message"):
        ExtractiveSummarizer(max_chars_per_message=10)


TEXT = st.text(st.characters(codec="utf-8"), max_size=300)
MESSAGE = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, TEXT),
    st.builds(lambda t: {"role": "assistant", "content": t}, TEXT),
    st.builds(
        lambda t, a: {
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call("h", "tool", {"a": a})],
        },
        TEXT,
        TEXT,
    ),
    st.builds(lambda t: {"role": "tool", "tool_call_id": "h", "content": t}, TEXT),
)


@settings(max_examples=150, deadline=None)
@given(
    previous=st.one_of(st.none(), TEXT),
    messages=st.lists(MESSAGE, max_size=12),
    max_tokens=st.integers(1, 300),
)
def test_any_input_is_bounded_and_deterministic(
    previous: str | None, messages: list[Message], max_tokens: int
) -> None:
    """For any messages and previous text: within budget, and the same twice."""
    first = summarize(previous, messages, max_tokens=max_tokens)
    assert len(first) <= max_tokens * 4
    assert summarize(previous, messages, max_tokens=max_tokens) == first


@needs_transcripts
def test_real_transcripts_fold_within_budget() -> None:
    """Folding every real transcript chunk by chunk stays within budget and says something."""
    summarizer = ExtractiveSummarizer()
    for path in transcript_files():
        messages = load_transcript(path)["messages"]
        start = head_end(messages)
        previous: str | None = None
        for i in range(start, len(messages), 25):
            done = summarizer.summarize_now(previous, messages[i : i + 25], max_tokens=300)
            assert len(done.text) <= 1200, path.name
            previous = done.text
        if start < len(messages):
            assert previous not in (None, EMPTY), path.name


@needs_transcripts
def test_real_transcript_is_deterministic() -> None:
    """The biggest real agent run summarizes to the same text twice."""
    path = max(transcript_files(), key=lambda p: p.stat().st_size)
    messages = load_transcript(path)["messages"][1:]
    first = summarize(None, messages, max_tokens=1200)
    assert summarize(None, messages, max_tokens=1200) == first


def test_current_state_is_where_the_range_left_off_and_only_the_latest() -> None:
    """The last line of the last assistant text is the current state; a later range's
    replaces it when folded."""
    first = summarize(None, AGENT_RUN)
    assert section(first, "Current state/next step") == [
        "I will guard the empty case in `src/parser/core.py`."
    ]
    later = [{"role": "assistant", "content": "Done.\nNext: run the whole suite."}]
    assert section(summarize(first, later), "Current state/next step") == [
        "Next: run the whole suite."
    ]
