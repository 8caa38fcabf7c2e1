"""Anthropic <-> OpenAI conversion: exact shapes, round trips, and precise errors."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
import typing_extensions
from anthropic.types.beta import BetaContentBlockParam
from anthropic.types.beta.beta_tool_result_block_param import Content as BetaToolResultContent
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.errors import InvalidTranscript
from shared.formats import from_anthropic, to_anthropic, tools_from_anthropic, tools_to_anthropic
from shared.messages import validate
from tests.conftest import load_transcript, needs_transcripts, transcript_files

EPHEMERAL = {"type": "ephemeral"}


def _use(id_: str, name: str = "bash", **input_: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": id_, "name": name, "input": input_}


def _result(id_: str, content: Any = "ok", **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": id_, "content": content, **extra}


def _text(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": text, **extra}


def test_plain_chat_maps_to_the_same_openai_messages() -> None:
    """String system and string contents become plain OpenAI messages."""
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    assert from_anthropic("be brief", msgs) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    assert to_anthropic(from_anthropic("be brief", msgs)) == ("be brief", msgs)


def test_tool_use_and_results_map_to_tool_calls_and_tool_messages() -> None:
    """tool_use becomes a tool call with JSON arguments; each tool_result a tool message."""
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": [_text("on it"), _use("t1", cmd="ls"), _use("t2")]},
        {"role": "user", "content": [_result("t1", "a.py"), _result("t2", "b.py"), _text("thx")]},
    ]
    out = from_anthropic(None, msgs)
    assert out[1] == {
        "role": "assistant",
        "content": [_text("on it")],
        "tool_calls": [
            {
                "id": "t1",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"cmd": "ls"}'},
            },
            {"id": "t2", "type": "function", "function": {"name": "bash", "arguments": "{}"}},
        ],
    }
    assert out[2:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "a.py"},
        {"role": "tool", "tool_call_id": "t2", "content": "b.py"},
        {"role": "user", "content": [_text("thx")], "anthropic": {"continues": True}},
    ]
    assert validate(out) == out
    assert to_anthropic(out) == (None, msgs)


def test_anthropic_only_details_survive_in_extra_keys() -> None:
    """is_error, cache_control, absent content, system blocks and block order all round trip."""
    system = [_text("rules", cache_control=EPHEMERAL), _text("more")]
    msgs = [
        {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {**_use("a"), "cache_control": EPHEMERAL},
                _text("between"),
                _use("b"),
            ],
        },
        {
            "role": "user",
            "content": [
                _result("a", [_text("boom")], is_error=True),
                {"type": "tool_result", "tool_use_id": "b"},
            ],
        },
    ]
    out = from_anthropic(system, msgs)
    assert out[0] == {"role": "system", "content": system}
    assert out[2]["anthropic"] == {"tool_use_at": [1, 3]}
    assert out[2]["tool_calls"][0]["anthropic"] == {"cache_control": EPHEMERAL}
    assert out[3]["anthropic"] == {"block": {"is_error": True}}
    assert out[4] == {
        "role": "tool",
        "tool_call_id": "b",
        "content": "",
        "anthropic": {"no_content": True},
    }
    assert to_anthropic(out) == (system, msgs)


def test_rewritten_tool_content_converts_back_as_it_now_is() -> None:
    """A strategy's placeholder replaces absent content instead of being dropped."""
    msgs = [
        {"role": "assistant", "content": [_use("a")]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "a", "is_error": False}],
        },
    ]
    out = from_anthropic(None, msgs)
    out[1] = {**out[1], "content": "[tool result removed to save context]"}
    _, back = to_anthropic(out)
    assert back[1]["content"] == [
        _result("a", "[tool result removed to save context]", is_error=False)
    ]


def test_a_continuation_cut_from_its_tool_results_stands_alone() -> None:
    """If a summary cut removed the tool results, their trailing blocks become a user turn."""
    msgs: list[dict[str, Any]] = [
        {"role": "assistant", "content": [_use("a")]},
        {"role": "user", "content": [_result("a"), _text("and then")]},
    ]
    out = from_anthropic(None, msgs)
    summary = {"role": "user", "content": "[Summary of earlier conversation]"}
    assert to_anthropic([summary, out[-1]]) == (
        None,
        [summary, {"role": "user", "content": [_text("and then")]}],
    )


def test_previous_message_lets_a_batch_open_with_tool_results() -> None:
    """Appending results for a stored tool call validates against `previous`."""
    stored = from_anthropic(None, [{"role": "assistant", "content": [_use("x")]}])[-1]
    batch = [{"role": "user", "content": [_result("x")]}]
    assert from_anthropic(None, batch, previous=stored) == [
        {"role": "tool", "tool_call_id": "x", "content": "ok"}
    ]
    with pytest.raises(InvalidTranscript) as err:
        from_anthropic(None, batch)
    assert err.value.index == 0


@pytest.mark.parametrize(
    ("messages", "index", "fragment"),
    [
        ([{"role": "user", "content": [{"type": "video"}]}], 0, "unknown block type"),
        ([{"role": "developer", "content": "x"}], 0, "role"),
        ([{"role": "system", "content": [{"type": "image"}]}], 0, "text block"),
        ([{"role": "user", "content": "x", "name": "bob"}], 0, "unknown message keys"),
        ([{"role": "user", "content": 3}], 0, "'content'"),
        ([{"role": "user", "content": [_use("a")]}], 0, "cannot be in a user"),
        ([{"role": "assistant", "content": [_use("a"), _use("a")]}], 0, "duplicate"),
        (
            [
                {"role": "assistant", "content": [_use("a")]},
                {"role": "user", "content": [_result("b")]},
            ],
            1,
            "answers no",
        ),
        (
            [
                {"role": "assistant", "content": [_use("a")]},
                {"role": "user", "content": [_text("x"), _result("a")]},
            ],
            1,
            "before",
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "user", "content": [_result("a")]}],
            1,
            "does not follow",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "x"}],
                }
            ],
            0,
            "'input'",
        ),
        (
            [
                {"role": "assistant", "content": [_use("a")]},
                {"role": "user", "content": [_result("a", is_error="yes")]},
            ],
            1,
            "is_error",
        ),
        (
            [
                {"role": "assistant", "content": [_use("a")]},
                {"role": "user", "content": [_result("a", [{"type": "tool_use"}])]},
            ],
            1,
            "content block 0",
        ),
        ([{"role": "user", "content": [{"type": "text"}]}], 0, "'text'"),
    ],
)
def test_malformed_anthropic_input_names_the_message(
    messages: list[dict[str, Any]], index: int, fragment: str
) -> None:
    """Each malformed input raises InvalidTranscript with its message index and a precise reason."""
    with pytest.raises(InvalidTranscript) as err:
        from_anthropic(None, messages)
    assert err.value.index == index
    assert fragment in err.value.reason


@pytest.mark.parametrize("system", [3, [{"type": "image", "source": {}}], [_text("a"), "b"]])
def test_malformed_system_is_rejected(system: Any) -> None:
    """A system that is not a string or text blocks is an InvalidTranscript."""
    with pytest.raises(InvalidTranscript, match="system"):
        from_anthropic(system, [])


def test_openai_transcript_converts_to_valid_anthropic() -> None:
    """Native OpenAI input: system merge, tool runs, images, empty content next to tool calls."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "s1"},
        {"role": "developer", "content": [_text("s2")]},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}],
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "name": "f", "content": "out"},
        {"role": "user", "content": "next"},
        {
            "role": "assistant",
            "content": "done",
            "tool_calls": [
                {"id": "d", "type": "function", "function": {"name": "g", "arguments": {"k": 1}}}
            ],
        },
    ]
    system, out = to_anthropic(msgs)
    assert system == [_text("s1"), _text("s2")]
    assert out == [
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"},
                }
            ],
        },
        {"role": "assistant", "content": [_use("c", "f")]},
        {"role": "user", "content": [_result("c", "out")]},
        {"role": "user", "content": "next"},
        {"role": "assistant", "content": [_text("done"), _use("d", "g", k=1)]},
    ]
    assert from_anthropic(system, out)[-1]["tool_calls"][0]["id"] == "d"


@pytest.mark.parametrize(
    ("messages", "index", "fragment"),
    [
        (
            [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}],
            1,
            "after the start",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{oops"},
                        }
                    ],
                }
            ],
            0,
            "not valid JSON",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": "[1]"},
                        }
                    ],
                }
            ],
            0,
            "not a JSON object",
        ),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], 0, "no Anthropic form"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], 0, "url"),
        ([{"role": "tool", "tool_call_id": "c", "content": "x"}], 0, "tool result"),
    ],
)
def test_openai_input_without_anthropic_form_is_rejected(
    messages: list[dict[str, Any]], index: int, fragment: str
) -> None:
    """What Anthropic cannot express raises InvalidTranscript with the OpenAI index."""
    with pytest.raises(InvalidTranscript) as err:
        to_anthropic(messages)
    assert err.value.index == index
    assert fragment in err.value.reason


def test_tool_specs_round_trip_both_ways() -> None:
    """Anthropic tool definitions map to OpenAI function specs and back, extra keys included."""
    tools = [
        {
            "name": "bash",
            "description": "run",
            "input_schema": {"type": "object"},
            "cache_control": EPHEMERAL,
        },
        {"name": "noop", "input_schema": {"type": "object", "properties": {}}},
    ]
    specs = tools_from_anthropic(tools)
    assert specs[0] == {
        "type": "function",
        "function": {"name": "bash", "description": "run", "parameters": {"type": "object"}},
        "anthropic": {"cache_control": EPHEMERAL},
    }
    assert tools_to_anthropic(specs) == tools
    bare = [{"type": "function", "function": {"name": "f"}}]
    assert tools_to_anthropic(bare) == [
        {"name": "f", "input_schema": {"type": "object", "properties": {}}}
    ]


@pytest.mark.parametrize(
    "bad",
    [
        {"name": "x"},
        {"name": "", "input_schema": {}},
        {"name": "x", "input_schema": {}, "description": 1},
        "x",
    ],
)
def test_malformed_tool_definitions_are_rejected(bad: Any) -> None:
    """A tool definition without name or object input_schema is an InvalidTranscript."""
    with pytest.raises(InvalidTranscript, match="tool 0"):
        tools_from_anthropic([bad])


def test_non_function_openai_tools_are_rejected() -> None:
    """Only function tools have an Anthropic form."""
    with pytest.raises(InvalidTranscript, match="only function tools"):
        tools_to_anthropic([{"type": "web_search"}])


# --- property: the round trip is exact ---------------------------------------------------------

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
_cache = st.sampled_from([{}, {"cache_control": EPHEMERAL}])
_text_block = st.builds(lambda t, c: {"type": "text", "text": t, **c}, st.text(max_size=20), _cache)
_image = st.builds(
    lambda d: {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": d}},
    st.text("ABCD", max_size=8),
)
_thinking = st.builds(
    lambda t: {"type": "thinking", "thinking": t, "signature": "sig"}, st.text(max_size=10)
)
_ids = st.sampled_from(["t1", "t2", "t3", "toolu_A"])


@st.composite
def _assistant(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        return {"role": "assistant", "content": draw(st.text(max_size=20))}
    ids = draw(st.lists(_ids, unique=True, max_size=3))
    uses = [
        {
            "type": "tool_use",
            "id": i,
            "name": draw(st.sampled_from(["bash", "read"])),
            "input": draw(st.dictionaries(st.text(max_size=5), _json, max_size=3)),
            **draw(_cache),
        }
        for i in ids
    ]
    others = draw(st.lists(_text_block | _thinking, max_size=3))
    return {"role": "assistant", "content": draw(st.permutations(uses + others))}


@st.composite
def _user(draw: st.DrawFn, answerable: list[str]) -> dict[str, Any]:
    if not answerable and draw(st.booleans()):
        return {"role": "user", "content": draw(st.text(max_size=20))}
    results = []
    # providers require every tool_use answered by the next user turn, each exactly once
    for i in draw(st.permutations(answerable)):
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": i}
        content = draw(
            st.none() | st.text(max_size=20) | st.lists(_text_block | _image, max_size=2)
        )
        if content is not None:
            block["content"] = content
        if draw(st.booleans()):
            block["is_error"] = draw(st.booleans())
        results.append({**block, **draw(_cache)})
    rest = draw(st.lists(_text_block | _image, max_size=2))
    return {"role": "user", "content": results + rest}


@st.composite
def _conversation(draw: st.DrawFn) -> tuple[Any, list[dict[str, Any]]]:
    system = draw(st.none() | st.text(max_size=10) | st.lists(_text_block, max_size=2))
    msgs: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 8))):
        last = msgs[-1] if msgs else None
        answerable = [
            b["id"]
            for b in (last["content"] if last and last["role"] == "assistant" else [])
            if isinstance(b, dict) and b["type"] == "tool_use"
        ]
        assistant = not answerable and draw(st.booleans())
        msgs.append(draw(_assistant() if assistant else _user(answerable)))
    return system, msgs


@given(_conversation())
@settings(max_examples=200, deadline=None)
def test_round_trip_is_exact(conv: tuple[Any, list[dict[str, Any]]]) -> None:
    """to_anthropic(from_anthropic(x)) == x, and the OpenAI side is a valid transcript."""
    system, msgs = conv
    snapshot = json.dumps(conv, sort_keys=True)
    out = from_anthropic(system, msgs)
    assert validate(out) == out
    assert to_anthropic(out) == (system, msgs)
    assert json.dumps(conv, sort_keys=True) == snapshot  # the input was not mutated


@needs_transcripts
def test_real_transcripts_reach_a_fixed_point() -> None:
    """Every real OpenAI transcript converts to Anthropic and back to the same Anthropic form."""
    for path in transcript_files():
        data = load_transcript(path)
        system, msgs = to_anthropic(data["messages"])
        assert to_anthropic(from_anthropic(system, msgs)) == (system, msgs), path.name
        tools = tools_to_anthropic(data.get("tools", []))
        assert tools_to_anthropic(tools_from_anthropic(tools)) == tools, path.name


def _literal_types(union: Any) -> set[str]:
    """The `type` literals of the TypedDicts in an SDK union of block params."""
    out: set[str] = set()
    for cls in typing.get_args(union):
        if not typing_extensions.is_typeddict(cls):
            continue
        kind = typing_extensions.get_type_hints(cls, include_extras=True)["type"]
        while typing_extensions.get_origin(kind) is not typing.Literal:
            kind = typing_extensions.get_args(kind)[0]
        out.update(typing_extensions.get_args(kind))
    return out


_SDK_BLOCKS = sorted(
    _literal_types(BetaContentBlockParam)
    - {"text", "tool_use", "tool_result", "image", "document", "thinking", "redacted_thinking"}
)
_SDK_RESULT_PARTS = sorted(_literal_types(BetaToolResultContent) - {"text", "image", "document"})


@pytest.mark.parametrize("kind", _SDK_BLOCKS)
def test_every_block_type_of_the_sdk_is_carried_through_in_place(kind: str) -> None:
    """A block type the SDK knows (server tool results, MCP, compaction, ...) converts and
    back unchanged, in place: its transcript is fitted, not skipped as unreadable."""
    block = {"type": kind, "id": "srvtoolu_1", "content": {"opaque": [1, 2]}}
    user_side = kind == "container_upload"
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": [_text("go"), *([block] if user_side else [])]},
        {"role": "assistant", "content": [_text("a"), *([] if user_side else [block]), _use("t")]},
        {"role": "user", "content": [_result("t")]},
    ]
    assert to_anthropic(from_anthropic("sys", msgs)) == ("sys", msgs)


@pytest.mark.parametrize("kind", _SDK_RESULT_PARTS)
def test_every_tool_result_part_of_the_sdk_is_accepted(kind: str) -> None:
    """tool_result content may hold the SDK's other part types (tool_reference, ...)."""
    part = {"type": kind, "tool_name": "x"}
    msgs: list[dict[str, Any]] = [
        {"role": "assistant", "content": [_use("t")]},
        {"role": "user", "content": [_result("t", [_text("out"), part])]},
    ]
    assert to_anthropic(from_anthropic(None, msgs)) == (None, msgs)


def test_system_messages_among_the_messages_stay_there_in_place() -> None:
    """`role: system` messages (SDK 2.x) convert to OpenAI system messages and back to the
    same place among the messages, never merged into the `system` parameter."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": [_text("rules", cache_control=EPHEMERAL)]},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": [_use("a")]},
        {"role": "user", "content": [_result("a")]},
        {"role": "system", "content": "from now on, be brief"},
        {"role": "user", "content": "go on"},
    ]
    for system in (None, "top"):
        converted = from_anthropic(system, msgs)
        assert [m["role"] for m in converted][-3:] == ["tool", "system", "user"]
        assert to_anthropic(converted) == (system, msgs)
    with pytest.raises(InvalidTranscript) as err:  # a system message cuts a tool pair
        from_anthropic(None, [msgs[2], msgs[4], msgs[3]])
    assert err.value.index == 2


def test_an_openai_refusal_converts_to_its_text() -> None:
    """An assistant refusal (null content, `refusal` text) becomes a non-empty Anthropic turn."""
    messages = [
        {"role": "user", "content": "do something forbidden"},
        {"role": "assistant", "content": None, "refusal": "I can't help with that."},
        {"role": "user", "content": "fine, something else"},
    ]
    validate(messages)
    _, converted = to_anthropic(messages)
    assert converted[1] == {"role": "assistant", "content": "I can't help with that."}
