"""Gemini contents <-> OpenAI chat conversion: round trips, carried parts, signed turns whole."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.errors import InvalidTranscript
from shared.formats.gemini import from_gemini, gemini_tools, read_gemini, to_gemini
from shared.hashing import canonical
from shared.messages import groups, validate

SIGNATURE = "CiQB0e2Kb" + "x9/+=" * 40  # opaque to prefit, as Gemini 3 sends it
SYSTEM = {"role": "user", "parts": [{"text": "You are Gemini CLI, a careful agent."}]}
TASK = {"role": "user", "parts": [{"text": "Find why the cache is slow and fix it."}]}


def signed_call(k: int, parallel: bool = False) -> dict[str, Any]:
    """A Gemini 3 model turn: a thought, a call carrying the turn's signature (and a second
    call without one when `parallel`, as Gemini signs only the first)."""
    parts: list[dict[str, Any]] = [
        {"text": f"thinking about step {k}", "thought": True},
        {
            "functionCall": {"name": "run_shell_command", "args": {"command": f"grep -rn x {k}"}},
            "thoughtSignature": SIGNATURE,
        },
    ]
    if parallel:
        parts.append({"functionCall": {"name": "read_file", "args": {"path": f"src/{k}.py"}}})
    return {"role": "model", "parts": parts}


def responses(k: int, parallel: bool = False) -> dict[str, Any]:
    out: list[dict[str, Any]] = [
        {
            "functionResponse": {
                "name": "run_shell_command",
                "response": {"output": f"src/cache.py:{k}: miss " * 30},
            }
        }
    ]
    if parallel:
        out.append(
            {"functionResponse": {"name": "read_file", "response": {"output": "def f(): ..."}}}
        )
    return {"role": "user", "parts": out}


def session(turns: int) -> list[dict[str, Any]]:
    contents = [TASK]
    for k in range(turns):
        contents += [signed_call(k, parallel=k % 2 == 1), responses(k, parallel=k % 2 == 1)]
    contents.append({"role": "model", "parts": [{"text": "Fixed.", "thoughtSignature": "c2ln"}]})
    return contents


# every part kind prefit does not read as text or calls, each as a client would send it
ODD: list[dict[str, Any]] = [
    {"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": "iVBORw0K" * 20}}]},
    {
        "role": "user",
        "parts": [
            {"text": "look at this"},
            {"fileData": {"mimeType": "application/pdf", "fileUri": "https://x/files/1"}},
            {"videoMetadata": {"startOffset": "1s"}, "text": "clip"},
            {"someFuturePart": {"n": 123456789012345678901234567890, "x": [1, 2.5, None]}},
        ],
    },
    {
        "role": "model",
        "parts": [
            {"executableCode": {"language": "PYTHON", "code": "print(1)"}},
            {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "1"}},
            {"text": "done", "partMetadata": {"é": "✓"}},
        ],
    },
    {"parts": [{"text": "a content without its role"}]},
    {
        "role": "model",
        "parts": [{"functionCall": {"id": "c1", "name": "lookup"}}],  # no args
    },
    {
        "role": "function",  # older clients answer in a content of their own role
        "parts": [
            {"functionResponse": {"id": "c1", "name": "lookup", "response": {"a": 1, "b": [2]}}}
        ],
    },
    {"role": "user", "parts": [{"text": "then"}], "extra": True},
]


@pytest.mark.parametrize("contents", [session(6), [TASK, *ODD], [TASK]])
def test_contents_come_back_exactly(contents: list[dict[str, Any]]) -> None:
    """What prefit does not cut converts back equal, keys in their order, through the
    store's canonical JSON too (which sorts keys)."""
    messages = from_gemini(SYSTEM, contents)
    validate(messages)
    assert json.dumps(to_gemini(messages)) == json.dumps(contents)
    stored = [json.loads(canonical(m)) for m in messages]
    assert json.dumps(to_gemini(stored)) == json.dumps(contents)


def test_a_model_turn_and_its_responses_are_one_turn_group() -> None:
    """A signed call's turn and the responses that answer it are atomic for every strategy;
    the responses answer the calls in order (ids made from their place)."""
    messages, origins = read_gemini(SYSTEM, session(2))
    assert [m["role"] for m in messages] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "tool", "assistant",
    ]  # fmt: skip
    assert origins == [-1, 0, 1, 2, 3, 4, 4, 5]
    assert (3, 5) not in groups(messages) and (4, 7) in groups(messages)
    calls = messages[4]["tool_calls"]
    assert [m["tool_call_id"] for m in messages[5:7]] == [c["id"] for c in calls]
    assert messages[5]["content"].startswith("src/cache.py:1: miss")


def test_a_cut_transcript_keeps_signed_turns_whole() -> None:
    """Dropping a turn group drops the model turn with its responses; the turns left keep
    their thoughts and signatures where they were."""
    contents = session(4)
    messages = from_gemini(SYSTEM, contents)
    spans = groups(messages)
    kept = [m for a, b in spans if (a, b) != spans[2] for m in messages[a:b]]  # turn 0 gone
    assert to_gemini(kept) == [contents[0], *contents[3:]]


def test_a_shortened_tool_output_converts_back_as_it_now_is() -> None:
    """A strategy rewrites a tool message's text: its response says so, all else as sent."""
    contents = session(1)
    messages = from_gemini(None, contents)
    messages[2] = {**messages[2], "content": "[output cleared]"}
    back = to_gemini(messages)
    assert back[2]["parts"][0]["functionResponse"] == {
        "name": "run_shell_command",
        "response": {"output": "[output cleared]"},
    }
    assert back[1] == contents[1]  # the signed call untouched


def test_a_summary_prefit_adds_is_a_user_content() -> None:
    """A message with no Gemini marks (a summary) becomes a user content of its text."""
    messages = from_gemini(SYSTEM, session(1))
    summary = {"role": "user", "content": "[Summary of messages 2 to 3]"}
    back = to_gemini([messages[0], messages[1], summary, *messages[4:]])
    assert back[1] == {"role": "user", "parts": [{"text": "[Summary of messages 2 to 3]"}]}


def test_non_text_parts_are_carried_and_counted_flat_or_by_size() -> None:
    """User parts that are not text ride as `gemini` parts (counted flat, as images are);
    model parts that are not text or calls as `thinking` (counted by their size)."""
    messages = from_gemini(None, ODD)
    assert messages[0]["content"][0]["type"] == "gemini"
    assert [p["type"] for p in messages[2]["content"]] == ["thinking", "thinking", "text"]


@pytest.mark.parametrize(
    ("contents", "at", "fault"),
    [
        ("nope", None, "'contents' must be a list"),
        ([TASK, "x"], 1, "content must be an object"),
        ([{"role": "tool", "parts": []}], 0, "role must be"),
        ([{"role": "user"}], 0, "list of 'parts'"),
        ([TASK, responses(0)], 1, "answers no functionCall"),
        ([{"role": "model", "parts": [{"functionCall": {"args": {}}}]}], 0, "'name'"),
    ],
)
def test_malformed_contents_name_the_content_at_fault(
    contents: Any, at: int | None, fault: str
) -> None:
    with pytest.raises(InvalidTranscript) as caught:
        read_gemini(None, contents)
    assert fault in caught.value.reason and caught.value.index == at


def test_function_declarations_are_counted_as_tool_specs() -> None:
    """Each declaration is a chat function spec; other tools are counted as they came."""
    decl = {"name": "read_file", "parameters": {"type": "object"}}
    tools = [{"functionDeclarations": [decl, decl]}, {"googleSearch": {}}]
    assert gemini_tools(tools) == [
        {"type": "function", "function": decl},
        {"type": "function", "function": decl},
        {"googleSearch": {}},
    ]
    assert gemini_tools(None) == []
