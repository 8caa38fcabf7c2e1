"""Validation, turn groups, requests, thinking turns and the head of OpenAI-format transcripts."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from shared.errors import InvalidRequest, InvalidTranscript
from shared.formats.anthropic import from_anthropic
from shared.head import head_end
from shared.messages import cut_before, groups, is_request, thinking_turns, thinks, validate
from tests.builders import calling, tool_call
from tests.conftest import load_transcript, needs_transcripts, transcript_files
from tests.shared.generated import REMINDER, thinking_sessions


def test_groups_keep_calls_with_their_results() -> None:
    """An assistant message with tool calls and its results form one group."""
    msgs = [
        {"role": "user", "content": "a"},
        calling(tool_call("1", "f", "{}"), tool_call("2", "f", "{}")),
        {"role": "tool", "tool_call_id": "1", "content": "x"},
        {"role": "tool", "tool_call_id": "2", "content": "y"},
        {"role": "assistant", "content": "done"},
    ]
    assert groups(msgs) == [(0, 1), (1, 4), (4, 5)]
    assert groups(msgs, start=1) == [(1, 4), (4, 5)]


def test_head_is_system_messages_plus_first_user() -> None:
    """The head covers leading system/developer messages and the task (shared/head.py)."""
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "developer", "content": "d"},
        {"role": "user", "content": "u"},
    ]
    assert head_end(msgs) == 3
    assert head_end(msgs, keep_first_user=False) == 2
    assert head_end([{"role": "assistant", "content": "x"}]) == 0
    assert head_end([{"role": "assistant", "content": "hi"}, {"role": "user", "content": "u"}]) == 2


def test_reused_ids_and_trailing_pending_call_are_valid() -> None:
    """Ids repeat across turns in real clients; a last call may still be unanswered."""
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("0", "f", "{}")]},
        {"role": "tool", "tool_call_id": "0", "content": "x", "name": "f"},
        calling(tool_call("0", "f", "{}")),
        {"role": "tool", "tool_call_id": "0", "content": ""},
        calling(tool_call("0", "f", "{}")),
    ]
    assert validate(msgs) == msgs


@pytest.mark.parametrize(
    ("msgs", "index", "reason"),
    [
        ([{"role": "wizard", "content": "x"}], 0, "unknown role 'wizard'"),
        ([{"role": "user"}], 0, "'content' is missing"),
        ([{"role": "user", "content": 3}], 0, "'content' must be a string, null or a list"),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "tool", "tool_call_id": "1", "content": "x"},
            ],
            1,
            "tool result does not follow",
        ),
        (
            [
                calling(tool_call("1", "f", "{}")),
                {"role": "tool", "tool_call_id": "2", "content": "x"},
            ],
            1,
            "answers no call",
        ),
        (
            [
                calling(tool_call("1", "f", "{}")),
                {"role": "tool", "content": "x"},
            ],
            1,
            "needs a non-empty string 'tool_call_id'",
        ),
        (
            [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]}],
            0,
            "needs a non-empty string 'id'",
        ),
        ([{"role": "user", "content": [{"type": "text"}]}], 0, "needs a string 'text'"),
        (
            [
                calling(tool_call("1", "f", "{}"), tool_call("2", "f", "{}")),
                {"role": "tool", "tool_call_id": "1", "content": "x"},
                {"role": "user", "content": "and?"},
            ],
            2,
            "tool call(s) '2' were never answered",
        ),
        (
            [
                calling(tool_call("1", "f", "{}")),
                calling(tool_call("2", "f", "{}")),
            ],
            1,
            "'1' were never answered",
        ),
        (
            [
                calling(tool_call("1", "f", "{}")),
                {"role": "tool", "tool_call_id": "1", "content": "x"},
                {"role": "tool", "tool_call_id": "1", "content": "again"},
            ],
            2,
            "was already answered",
        ),
        (
            [calling(tool_call("1", "f", "{}"), tool_call("1", "f", "{}"))],
            0,
            "appears twice in one message",
        ),
        (
            [
                calling(tool_call("1", "f", "{}")),
                {"role": "tool", "tool_call_id": "1", "content": "x"},
                {"role": "user", "content": "ok"},
                {"role": "tool", "tool_call_id": "1", "content": "late"},
            ],
            3,
            "tool result does not follow",
        ),
        (["hello"], 0, "message must be an object, got str"),
    ],
)
def test_invalid_transcripts_name_index_and_reason(
    msgs: list[Any], index: int, reason: str
) -> None:
    """Every malformed message is reported with its index and a precise reason."""
    with pytest.raises(InvalidTranscript) as err:
        validate(msgs)
    assert err.value.index == index
    assert reason in str(err.value)


def test_empty_transcript_is_refused() -> None:
    """Nothing to send is not a transcript a provider accepts."""
    with pytest.raises(InvalidTranscript, match="empty"):
        validate([])


def test_shapes_providers_accept_stay_valid() -> None:
    """Calls in flight at the end (all or some answered), the same role twice, null content."""
    pending = [
        {"role": "user", "content": "go"},
        calling(tool_call("a", "f", "{}"), tool_call("b", "f", "{}")),
        {"role": "tool", "tool_call_id": "b", "content": "b first"},
    ]
    assert validate(pending) == pending
    twice = [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    assert validate(twice) == twice


def test_transcript_must_be_a_list() -> None:
    """A non-list transcript is refused without an index."""
    with pytest.raises(InvalidTranscript, match="must be a list"):
        validate({"role": "user"})


@needs_transcripts
@pytest.mark.parametrize("path", transcript_files(), ids=lambda p: p.stem[:50])
def test_every_real_transcript_is_valid(path: Any) -> None:
    """All 52 real transcripts, with their quirks, pass validation."""
    msgs = load_transcript(path)["messages"]
    assert validate(msgs) == msgs
    assert sum(b - a for a, b in groups(msgs)) == len(msgs)


def test_groups_refuse_what_is_not_a_transcript() -> None:
    """A non-object message or a negative start raises a typed error, not AttributeError."""
    with pytest.raises(InvalidTranscript) as exc:
        groups([{"role": "user", "content": "a"}, "b"])
    assert exc.value.index == 1
    with pytest.raises(InvalidRequest):
        groups([{"role": "user", "content": "a"}], -1)


def test_a_refusal_sent_back_as_it_came_is_valid() -> None:
    """OpenAI returns a refusal as content null plus `refusal` (model_dump() adds null
    tool_calls, audio...): sent back, it is a valid assistant turn; null content with no
    refusal, calls or audio is still refused."""
    refusal = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    refusal |= {"tool_calls": None, "function_call": None, "audio": None, "annotations": []}
    msgs = [{"role": "user", "content": "x"}, refusal, {"role": "user", "content": "ok"}]
    assert validate(msgs) == msgs
    with pytest.raises(InvalidTranscript, match="null"):
        validate([msgs[0], {**refusal, "refusal": ""}])


def legacy_session() -> list[dict[str, Any]]:
    """A conversation in OpenAI's legacy function-calling shape, as old SDK code sends it."""
    fc = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "function_call": fc},
        {"role": "function", "name": "get_weather", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "21 degrees."},
    ]


def test_legacy_function_results_are_valid_and_grouped_with_their_call() -> None:
    """A `function` message answering the assistant's `function_call` is valid (OpenAI still
    accepts it) and forms one turn group with that call."""
    msgs = legacy_session()
    assert validate(msgs) == msgs
    assert groups(msgs) == [(0, 1), (1, 3), (3, 4)]


@pytest.mark.parametrize(
    ("change", "index", "reason"),
    [
        (lambda m: m.pop(1), 1, "does not follow an assistant message with function_call"),
        (lambda m: m[2].pop("name"), 2, "needs a non-empty string 'name'"),
        (lambda m: m[1].update(function_call="f"), 1, "'function_call' needs a string 'name'"),
        (lambda m: m[0].update(function_call={"name": "f"}), 0, "only valid on assistant"),
    ],
)
def test_misplaced_legacy_function_messages_are_refused(
    change: Any, index: int, reason: str
) -> None:
    """A `function` result without the call right before it, or without a name, is refused."""
    msgs = legacy_session()
    change(msgs)
    with pytest.raises(InvalidTranscript) as info:
        validate(msgs)
    assert info.value.index == index and reason in str(info.value)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("Fix the build", True),
        (REMINDER, False),
        (REMINDER + "\n\n  ", False),
        (REMINDER + "\nFix the build", True),
        ("<environment_context><cwd>/r</cwd></environment_context>", False),
        (
            "<system-reminder>a</system-reminder><local-command-stdout>b</local-command-stdout>",
            False,
        ),
        ("<div>my own markup</div>", True),
        ("", False),
        ("   ", False),
        ([{"type": "text", "text": REMINDER}, {"type": "text", "text": "Rename it"}], True),
        ([{"type": "text", "text": REMINDER}], False),
        (
            [{"type": "text", "text": REMINDER}, {"type": "image_url", "image_url": {"url": "u"}}],
            True,
        ),
    ],
)
def test_a_request_is_what_the_person_wrote(content: Any, expected: bool) -> None:
    """A user message is a request when the person wrote something in it: not only injected
    blocks, not blank; an attachment counts."""
    assert is_request({"role": "user", "content": content}) is expected


def test_the_rest_of_a_tool_result_turn_is_no_request() -> None:
    """Text after tool results in one Anthropic user turn is that turn's, not a request;
    nor is anything an assistant or a tool says."""
    msgs = from_anthropic(
        None,
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": "ok"},
                    {"type": "text", "text": "and also do this"},
                ],
            },
        ],
    )
    assert [is_request(m) for m in msgs] == [True, False, False, False]


def test_a_thinking_turn_runs_from_its_first_thinking_step_to_the_next_request() -> None:
    """Positions inside a thinking turn name its start; the turn's own first message, the
    messages before it and the next request do not."""
    think = {"type": "thinking", "thinking": "plan", "signature": "s"}
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    use2 = {"type": "tool_use", "id": "t2", "name": "f", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "r"}
    result2 = {"type": "tool_result", "tool_use_id": "t2", "content": "r"}
    msgs = from_anthropic(
        "sys",
        [
            {"role": "user", "content": "task"},  # 1
            {"role": "assistant", "content": [think, {"type": "text", "text": "a"}, use]},  # 2
            {"role": "user", "content": [result, {"type": "text", "text": REMINDER}]},  # 3, 4
            {"role": "assistant", "content": [{"type": "text", "text": "b"}, use2]},  # 5
            {"role": "user", "content": [result2]},  # 6
            {"role": "user", "content": REMINDER},  # 7: no request, the turn goes on
            {"role": "assistant", "content": "done"},  # 8
            {"role": "user", "content": "next"},  # 9
        ],
    )
    assert [thinks(m) for m in msgs] == [i == 2 for i in range(10)]
    inside, opened = thinking_turns(msgs)
    assert inside == [-1, -1, -1, 2, 2, 2, 2, 2, 2, -1] and opened == -1
    assert [cut_before(msgs, i) for i in range(11)] == [0, 1, 2, 2, 2, 2, 2, 2, 2, 9, 10]
    assert thinking_turns(msgs[:6]) == ([-1, -1, -1, 2, 2, 2], 2)
    assert thinking_turns(msgs, 6, opened=2)[0] == [2, 2, 2, -1]


def test_a_responses_reasoning_item_opens_no_thinking_turn() -> None:
    """Responses items carried as `thinking` parts are tied only within their message."""
    carried = {"type": "thinking", "thinking": '{"type":"reasoning"}', "responses": "item"}
    assert not thinks({"role": "assistant", "content": [carried]})
    redacted = {"type": "redacted_thinking", "data": "x"}
    assert thinks({"role": "assistant", "content": [redacted], "tool_calls": []})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(thinking_sessions())
def test_the_two_readings_of_thinking_turns_agree(session: tuple[Any, Any]) -> None:
    """`thinking_turns` read in one pass, in two at any split, and `cut_before` read backwards
    place the same cuts."""
    msgs = from_anthropic(*session)
    inside, _ = thinking_turns(msgs)
    for split in range(len(msgs) + 1):
        head, opened = thinking_turns(msgs[:split])
        assert head + thinking_turns(msgs, split, opened)[0] == inside
    for i in range(len(msgs)):
        assert cut_before(msgs, i) == (inside[i] if inside[i] >= 0 else i)
