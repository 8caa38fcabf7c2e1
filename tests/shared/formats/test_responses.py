"""Responses input <-> OpenAI chat conversion: round trips, carried items, pairs by call_id."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.errors import InvalidTranscript
from shared.formats.responses import from_responses, read_responses, to_responses
from shared.hashing import canonical
from shared.messages import groups, validate
from shared.strategies.truncate import cut_text

REASONING = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [{"type": "summary_text", "text": "thinking about the cache"}],
    "encrypted_content": "gAAAAABo" + "x9/+=" * 50,
}
# every item kind prefit does not read, each as a client would send it
OPAQUE: list[dict[str, Any]] = [
    REASONING,
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
    {"type": "file_search_call", "id": "fs_1", "queries": ["q"], "status": "completed"},
    {"type": "computer_call", "id": "cu_1", "call_id": "cc_1", "action": {"type": "click"}},
    {"type": "computer_call_output", "call_id": "cc_1", "output": {"type": "computer_screenshot"}},
    {"type": "code_interpreter_call", "id": "ci_1", "code": "1+1", "outputs": None},
    {"type": "image_generation_call", "id": "ig_1", "result": "iVBORw0", "status": "completed"},
    {"type": "mcp_list_tools", "id": "ml_1", "server_label": "s", "tools": []},
    {"type": "mcp_call", "id": "mc_1", "name": "t", "arguments": "{}", "server_label": "s"},
    {"type": "item_reference", "id": "msg_old"},
    {"id": "msg_older"},  # an item reference without its optional type
    {"type": "some_future_item", "payload": [1, 2.5, None, {"deep": True}, "é ✓"]},
    {"type": "huge_number_item", "n": 123456789012345678901234567890},
]


def _call(call_id: str, name: str = "shell", arguments: str = '{"cmd":["ls"]}') -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def _output(call_id: str, output: Any = "ok") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def _codex_input() -> list[dict[str, Any]]:
    """Items as Codex sends them: developer and user messages, reasoning, both call kinds,
    a local shell pair, an assistant message."""
    return [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "p"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "task"}]},
        REASONING,
        _call("c1"),
        _output("c1", "file.py\n"),
        {**REASONING, "id": "rs_2"},
        {
            "type": "custom_tool_call",
            "id": "ctc_1",
            "status": "completed",
            "call_id": "c2",
            "name": "apply_patch",
            "input": "*** Begin Patch\n*** End Patch",
        },
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done!"},
        {"type": "local_shell_call", "id": "ls_1", "call_id": "c3", "status": "completed"},
        {"type": "local_shell_call_output", "id": "c3", "output": '{"output":"x"}'},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Fixed.", "annotations": []}],
        },
        {"role": "user", "content": "thanks"},
    ]


def _bytes(items: Any) -> str:
    return json.dumps(items)


def _block(kind: int, k: int) -> list[dict[str, Any]]:
    """One stretch of a transcript, by kind; `k` makes its ids unique."""
    call = _call(f"c{k}")
    custom = {"type": "custom_tool_call", "call_id": f"x{k}", "name": "apply_patch", "input": "p"}
    assistant = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "t", "annotations": []}],
    }
    blocks: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": f"u{k}"}],
        [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "d"}],
            }
        ],
        [assistant],
        [{**REASONING, "id": f"rs{k}"}, call, _output(f"c{k}")],
        [
            call,
            {**call, "call_id": f"d{k}"},
            _output(f"c{k}"),
            _output(f"d{k}", [{"type": "input_text", "text": "o"}]),
        ],
        [custom, {"type": "custom_tool_call_output", "call_id": f"x{k}", "output": "done"}],
        [OPAQUE[(k * 7) % len(OPAQUE)]],
        [
            {"type": "local_shell_call", "call_id": f"l{k}"},
            {"type": "local_shell_call_output", "id": f"l{k}", "output": "o"},
        ],
    ]
    return blocks[kind % len(blocks)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=7), max_size=25), st.booleans())
def test_any_mix_of_items_round_trips_and_validates(kinds: list[int], instructions: bool) -> None:
    """Whatever the order of the stretches, the messages are valid and convert back equal."""
    items = [item for k, kind in enumerate([0, *kinds]) for item in _block(kind, k)]
    messages = from_responses("i" if instructions else None, items)
    validate(messages)
    assert _bytes(to_responses(messages)) == _bytes(items)


def test_codex_input_round_trips_byte_for_byte() -> None:
    """What Codex sends converts to valid chat messages and back to the same JSON text."""
    items = _codex_input()
    messages = from_responses("be careful", items)
    validate(messages)
    assert messages[0] == {
        "role": "system",
        "content": "be careful",
        "responses": {"instructions": True},
    }
    assert _bytes(to_responses(messages)) == _bytes(items)


def test_messages_read_back_from_the_store_convert_to_the_same_bytes() -> None:
    """The store keeps messages as canonical (key-sorted) JSON: what it gives back still
    converts to the items as the client sent them, keys in their order."""
    items = [*_codex_input(), *OPAQUE[4:5]]
    items.insert(5, {"type": "local_shell_call_output", "id": "zz", "output": "after"})
    stored = [json.loads(canonical(m)) for m in from_responses("be careful", items)]
    assert _bytes(to_responses(stored)) == _bytes(items)


@pytest.mark.parametrize("item", OPAQUE, ids=lambda i: str(i.get("type")))
def test_every_item_prefit_does_not_read_survives_in_place(item: dict[str, Any]) -> None:
    """Each carried item comes back byte for byte, between the items it stood between."""
    items = [
        {"role": "user", "content": "go"},
        item,
        _call("c1"),
        _output("c1"),
        {"role": "user", "content": "next"},
    ]
    assert _bytes(to_responses(from_responses(None, items))) == _bytes(items)


def test_carried_items_are_counted_and_ride_in_their_turn() -> None:
    """A reasoning item and the calls after it are one assistant message, answered by the
    outputs that follow: one turn group, kept or cut whole; its JSON is counted as text."""
    items = [
        {"role": "user", "content": "go"},
        REASONING,
        _call("a"),
        _call("b"),
        _output("a"),
        _output("b"),
    ]
    messages = from_responses(None, items)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert groups(messages) == [(0, 1), (1, 4)]
    [part] = messages[1]["content"]
    assert part["type"] == "thinking" and REASONING["encrypted_content"] in part["thinking"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["a", "b"]


def test_an_output_item_after_function_outputs_stays_with_its_pair() -> None:
    """A local shell output among function outputs rides with them: never split off."""
    items = [
        {"role": "user", "content": "go"},
        _call("a"),
        {"type": "local_shell_call", "id": "ls", "call_id": "b", "status": "completed"},
        _output("a"),
        {"type": "local_shell_call_output", "id": "b", "output": "x"},
        {"role": "user", "content": "next"},
    ]
    messages = from_responses(None, items)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user"]
    assert _bytes(to_responses(messages)) == _bytes(items)


def test_an_assistant_message_with_no_parts_round_trips() -> None:
    """An assistant message item with an empty content list, beside a call, comes back."""
    empty = {"type": "message", "role": "assistant", "content": [], "id": "m"}
    items = [{"role": "user", "content": "go"}, empty, _call("a"), _output("a")]
    assert _bytes(to_responses(from_responses(None, items))) == _bytes(items)


def test_a_local_shell_loop_is_one_turn_per_step() -> None:
    """Reasoning, a local shell call and its output, again and again: each step its own
    turn (cut whole, pairs kept), and parallel outputs stay in the turn of their calls."""
    step = [
        REASONING,
        {"type": "local_shell_call", "id": "ls1", "call_id": "a", "status": "completed"},
        {"type": "local_shell_call", "id": "ls2", "call_id": "b", "status": "completed"},
        {"type": "local_shell_call_output", "id": "a", "output": "x"},
        {"type": "local_shell_call_output", "id": "b", "output": "y"},
    ]
    items = [{"role": "user", "content": "go"}, *step, *step, *step]
    messages = from_responses(None, items)
    assert [m["role"] for m in messages] == ["user", "assistant", "assistant", "assistant"]
    assert all(len(m["content"]) == len(step) for m in messages[1:])
    assert _bytes(to_responses(messages)) == _bytes(items)


def test_a_shortened_output_converts_back_with_its_other_keys() -> None:
    """A strategy's shortened tool output and message text go back in their own items."""
    long = "line\n" * 5000
    items = [
        {"role": "user", "content": "go"},
        _call("a"),
        {
            "type": "function_call_output",
            "id": "fco",
            "call_id": "a",
            "output": long,
            "status": "completed",
        },
        _output(
            "b_never",
            [{"type": "input_text", "text": long}, {"type": "input_image", "file_id": "f"}],
        ),
    ]
    items[3]["call_id"] = "a2"
    items.insert(3, _call("a2"))  # a second turn whose output is a list of parts
    messages = from_responses(None, items)
    messages[2] = {**messages[2], "content": cut_text(long, 100, 0.7)}
    parts = messages[4]["content"]
    messages[4] = {**messages[4], "content": [{**parts[0], "text": "short"}, parts[1]]}
    back = to_responses(messages)
    assert back[2] == {**items[2], "output": cut_text(long, 100, 0.7)}
    assert list(back[2]) == list(items[2])  # key order kept
    assert back[4]["output"] == [
        {"type": "input_text", "text": "short"},
        {"type": "input_image", "file_id": "f"},
    ]


def test_a_summary_message_and_a_cleared_output_convert_to_valid_items() -> None:
    """Messages prefit makes (a summary) become easy input messages; a cleared output a string."""
    items = [
        {"role": "user", "content": "go"},
        REASONING,
        _call("a"),
        _output("a", [{"type": "input_text", "text": "big"}]),
    ]
    messages = from_responses(None, items)
    messages[2] = {**messages[2], "content": "[cleared]"}
    summary = {"role": "user", "content": "Summary of earlier turns"}
    back = to_responses([messages[0], summary, *messages[1:]])
    assert back[1] == summary
    assert back[2] == REASONING and back[3] == _call("a")
    assert back[4] == {**_output("a"), "output": "[cleared]"}


def test_input_as_a_string_and_easy_messages() -> None:
    """A string input is one user message; easy messages of every role convert plainly."""
    assert from_responses(None, "hi") == [{"role": "user", "content": "hi"}]
    easy = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
        {"role": "developer", "content": "d"},
    ]
    messages = from_responses(None, easy)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "developer"]
    assert to_responses(messages) == easy


def test_a_call_and_its_output_pair_by_call_id() -> None:
    """An output that answers no call of the turn before it is refused by validation,
    naming the item it came from."""
    items = [{"role": "user", "content": "go"}, _call("a"), _output("zzz")]
    messages, origins = read_responses(None, items)
    with pytest.raises(InvalidTranscript) as caught:
        validate(messages)
    assert caught.value.index is not None and origins[caught.value.index] == 2


@pytest.mark.parametrize(
    ("instructions", "items", "reason"),
    [
        (None, 42, "'input' must be a string or a list"),
        (7, "hi", "'instructions' must be a string"),
        (None, ["x"], "item must be an object"),
        (None, [{"type": "message", "role": "tool", "content": "x"}], "message role"),
        (None, [{"role": "user", "content": 3}], "'content' must be a string"),
        (None, [{"type": "function_call", "name": "f", "arguments": "{}"}], "'call_id'"),
        (None, [{"role": "user", "content": [{"type": "input_text"}]}], "string 'text'"),
    ],
)
def test_malformed_input_is_refused_precisely(instructions: Any, items: Any, reason: str) -> None:
    """Each malformed shape is an InvalidTranscript saying what is wrong."""
    with pytest.raises(InvalidTranscript, match=reason):
        from_responses(instructions, items)
