"""The Anthropic endpoint through the real `anthropic` SDK: fitted, streamed, authenticated;
and its dialect's parts (the prompt count tap, errors mapped to the client's messages)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest
from hypothesis import given, settings

from api.proxy.dialects.anthropic import (
    AnthropicDialect,
    Conversions,
    StartTap,
    source_index,
)
from shared.errors import InvalidTranscript
from shared.formats import from_anthropic, to_anthropic
from shared.formats.anthropic import unmarked
from shared.settings import Settings
from tests.api.conftest import WINDOW
from tests.api.proxy.conftest import TASK, Proxy, agent_session, sent_fits, wait_for
from tests.builders import user
from tests.fakeprovider import WORDS, Reply, prompt_tokens
from tests.shared.formats.test_formats import _conversation

ANTHROPIC_TOOLS = [
    {
        "name": "bash",
        "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        "cache_control": {"type": "ephemeral"},
    }
]


def sdk(proxy: Proxy, **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=proxy.key, max_retries=0, **kw)


def test_long_conversation_is_fitted_keeping_system_task_tool_pairs_and_fields(
    proxy: Proxy,
) -> None:
    """The fitted prompt goes back in Anthropic form; every other field and the version and
    beta headers as the client sent them; the deployment's x-api-key, never prefit's key."""
    system, messages = to_anthropic(agent_session(60))
    raw = sdk(proxy).messages.with_raw_response.create(
        model=proxy.model,
        max_tokens=512,
        system=system,  # type: ignore[arg-type]
        messages=messages,  # type: ignore[arg-type]
        tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
        metadata={"user_id": "u-1"},
        extra_headers={"anthropic-beta": "some-beta-2025"},
        extra_body={"temperature": 0.3, "vendor_knob": True},
    )
    assert raw.parse().content[0].text == "".join(WORDS)  # type: ignore[union-attr]
    assert raw.headers["x-prefit-fit"] == "applied"
    [got] = proxy.fake.received
    assert got.status == 200
    assert got.body["system"] == system
    assert got.body["messages"][0] == {"role": "user", "content": TASK}
    sent = from_anthropic(got.body["system"], got.body["messages"])  # pairs checked here
    assert sent_fits(sent, ANTHROPIC_TOOLS) and len(got.body["messages"]) <= len(messages)
    rest = {k: v for k, v in got.body.items() if k not in ("messages", "system")}
    assert rest == {
        "model": proxy.model,
        "max_tokens": 512,
        "tools": ANTHROPIC_TOOLS,
        "temperature": 0.3,
        "metadata": {"user_id": "u-1"},
        "vendor_knob": True,
    }
    assert got.headers["x-api-key"] == "sk-upstream-anthropic"
    assert "authorization" not in got.headers
    assert got.headers["anthropic-beta"] == "some-beta-2025"
    assert got.headers["anthropic-version"] == sdk(proxy).default_headers["anthropic-version"]


def test_x_api_key_authenticates_as_older_sdks_send_it(proxy: Proxy) -> None:
    """`x-api-key: <prefit key>` (no Authorization) is the tenant's key too."""
    r = httpx.post(
        f"{proxy.url}/v1/messages",
        headers={"x-api-key": proxy.key, "anthropic-version": "2023-06-01"},
        json={"model": proxy.model, "max_tokens": 10, "messages": [user("hi")]},
    )
    assert r.status_code == 200, r.text
    assert r.json()["content"][0]["text"] == "".join(WORDS)
    assert proxy.fake.received[0].headers["anthropic-version"] == "2023-06-01"


def test_a_stream_arrives_intact_and_in_order(proxy: Proxy) -> None:
    """Every event passes through; the text is whole and in order."""
    system, messages = to_anthropic(agent_session(60))
    with sdk(proxy).messages.stream(
        model=proxy.model,
        max_tokens=100,
        system=system,  # type: ignore[arg-type]
        messages=messages,  # type: ignore[arg-type]
    ) as stream:
        assert "".join(stream.text_stream) == "".join(WORDS)
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn"
    [got] = proxy.fake.received
    assert sent_fits(from_anthropic(got.body["system"], got.body["messages"]), [])
    conv = stream.response.headers["x-prefit-conversation"]
    wait_for(lambda: proxy.info(conv).get("length"))  # synced after the stream


def test_errors_come_back_as_the_sdk_expects_them(proxy: Proxy) -> None:
    """prefit's own 401 and the provider's 529 raise the SDK's usual exception types."""
    wrong = anthropic.Anthropic(base_url=proxy.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.create(model=proxy.model, max_tokens=10, messages=[user("hi")])  # type: ignore[list-item]
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid API key"},
    }
    proxy.fake.script(Reply(529))
    with pytest.raises(anthropic.APIStatusError) as overloaded:
        sdk(proxy).messages.create(model=proxy.model, max_tokens=10, messages=[user("hi")])  # type: ignore[list-item]
    assert overloaded.value.status_code == 529
    assert overloaded.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]


def test_a_transcript_prefit_cannot_read_goes_as_it_is(proxy: Proxy) -> None:
    """An unknown block type: forwarded unchanged for the provider to judge, never refused."""
    messages = [{"role": "user", "content": [{"type": "future_block", "x": 1}]}]
    r = httpx.post(
        f"{proxy.url}/v1/messages",
        headers={"x-api-key": proxy.key},
        json={"model": proxy.model, "max_tokens": 10, "messages": messages},
    )
    assert r.status_code == 200
    assert r.headers["x-prefit-fit"] == "skipped (invalid transcript at message 0)"
    assert proxy.fake.received[0].body["messages"] == messages
    assert WINDOW  # the window is configured: only the transcript was unreadable


def test_count_tokens_counts_the_prompt_prefit_would_send(proxy: Proxy) -> None:
    """`messages.count_tokens` is fitted as `messages.create` is, then counted upstream: the
    SDK gets the provider's count of the fitted prompt, which fits the window."""
    system, messages = to_anthropic(agent_session(60))
    raw = sdk(proxy).messages.with_raw_response.count_tokens(
        model=proxy.model,
        system=system,  # type: ignore[arg-type]
        messages=messages,  # type: ignore[arg-type]
        tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
    )
    assert raw.headers["x-prefit-fit"] == "applied"
    [got] = proxy.fake.received
    assert got.path == "/v1/messages/count_tokens"
    assert got.headers["x-api-key"] == "sk-upstream-anthropic"
    assert got.body["messages"][0] == {"role": "user", "content": TASK}
    whole = {"system": system, "messages": messages, "tools": ANTHROPIC_TOOLS}
    counted = raw.parse().input_tokens
    assert counted == prompt_tokens("anthropic", got.body) <= WINDOW
    assert counted < prompt_tokens("anthropic", whole)


def test_count_tokens_of_an_unknown_model_goes_as_it_is(proxy: Proxy) -> None:
    """No window for the model: the body is counted upstream unchanged."""
    count = sdk(proxy).messages.count_tokens(
        model="claude-unknown", messages=[{"role": "user", "content": "hi"}]
    )
    [got] = proxy.fake.received
    assert got.body == {"model": "claude-unknown", "messages": [user("hi")]}
    assert count.input_tokens == prompt_tokens("anthropic", got.body)


def test_a_tool_call_left_unanswered_midway_is_forwarded_not_refused(proxy: Proxy) -> None:
    """A tool_use answered by plain text (prefit's check refuses it, after conversion) sends
    the request as it came, naming the Anthropic message; prefit answers no 400 itself: the
    provider's own 400 comes back, as Anthropic refuses it."""
    system, messages = to_anthropic(agent_session(40))
    use = {"type": "tool_use", "id": "toolu_x", "name": "bash", "input": {}}
    messages[1:1] = [{"role": "assistant", "content": [use]}, {"role": "user", "content": "go"}]
    r = httpx.post(
        f"{proxy.url}/v1/messages",
        headers={"x-api-key": proxy.key},
        json={"model": proxy.model, "max_tokens": 10, "system": system, "messages": messages},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith(
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after"
    )
    assert r.headers["x-prefit-fit"] == "skipped (invalid transcript at message 2)"
    assert proxy.fake.received[0].body["messages"] == messages


def test_system_messages_among_the_messages_are_fitted_and_kept_in_place(proxy: Proxy) -> None:
    """`role: system` messages (SDK 2.x) no longer make the transcript unreadable: it is
    fitted, the leading one stays first (head) and a recent one stays where it was."""
    system, messages = to_anthropic(agent_session(60))
    note = {"role": "system", "content": "answer in French from now on"}
    sent_in = [{"role": "system", "content": system}, *messages, note, user("go on")]
    raw = sdk(proxy).messages.with_raw_response.create(
        model=proxy.model,
        max_tokens=100,
        messages=sent_in,  # type: ignore[arg-type]
    )
    assert raw.headers["x-prefit-fit"] == "applied"
    got = proxy.fake.received[0].body
    assert "system" not in got
    assert got["messages"][:2] == sent_in[:2]
    assert got["messages"][-2:] == [note, user("go on")]
    assert sent_fits(from_anthropic(None, got["messages"]), [])


# --- conversions by identity -----------------------------------------------------------------

MARK = {"type": "ephemeral"}


def tool_round(k: int, mark: bool = False) -> list[dict[str, Any]]:
    """An assistant's tool call and the user turn answering it (its block marked if `mark`)."""
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": "ok"}
    if mark:
        result["cache_control"] = MARK
    use = {"type": "tool_use", "id": f"toolu_{k}", "name": "bash", "input": {"cmd": f"ls {k}"}}
    return [
        {"role": "assistant", "content": [{"type": "text", "text": f"step {k}"}, use]},
        {"role": "user", "content": [result]},
    ]


def test_a_message_object_seen_before_converts_to_the_same_objects() -> None:
    """The messages a resent body shares with the last one (the same parsed objects) convert
    to the objects they converted to; new ones are converted, all as `from_anthropic` does."""
    conversions = Conversions()
    first = [{"role": "user", "content": TASK}, *tool_round(0)]
    before = conversions.convert(first)
    resent = [*first, *tool_round(1)]
    after = conversions.convert(resent)
    assert all(a is b for a, b in zip(after, before, strict=False))
    assert [m for g in after for m in g] == from_anthropic(None, resent)


def test_a_message_edited_in_place_is_converted_again() -> None:
    """A message the client changed (new bytes, so a new object) converts afresh."""
    conversions = Conversions()
    first = [{"role": "user", "content": TASK}, *tool_round(0)]
    conversions.convert(first)
    edited = [first[0], {"role": "assistant", "content": "changed my mind"}, *tool_round(1)]
    got = conversions.convert(edited)
    assert got[1] == [{"role": "assistant", "content": "changed my mind"}]
    assert [m for g in got for m in g] == from_anthropic(None, edited)


def test_a_tool_result_after_remembered_messages_is_still_checked() -> None:
    """A result answering no call of the (remembered) message before it is refused, with its
    index, as when the whole transcript is converted."""
    conversions = Conversions()
    first = [{"role": "user", "content": TASK}, *tool_round(0)]
    conversions.convert(first)
    wrong = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope"}]}
    with pytest.raises(InvalidTranscript) as caught:
        conversions.convert([*first[:2], wrong])
    assert caught.value.index == 2


def test_moved_markers_convert_alike_and_come_back_upstream() -> None:
    """A message that held last turn's `cache_control` converts as it does without it, and
    the prompt sent gets the client's markers back on the messages it kept."""
    dialect = AnthropicDialect(Settings())
    system = [{"type": "text", "text": "sys", "cache_control": MARK}]
    task = {"role": "user", "content": [{"type": "text", "text": TASK, "cache_control": MARK}]}
    turn1 = [task, *tool_round(0, mark=True)]
    one, _ = dialect.transcript({"system": system, "messages": turn1}, lambda m: m)
    turn2 = [{"role": "user", "content": TASK}, *tool_round(0), *tool_round(1, mark=True)]
    two, _ = dialect.transcript({"system": system, "messages": turn2}, lambda m: m)
    assert two[: len(one)] == one and "cache_control" not in str(two[1:])
    body = {"system": system, "messages": turn2}
    sent = dialect.with_messages(body, two)
    assert sent["messages"] == turn2 and sent["system"] == system


def test_a_fitted_prompt_keeps_the_markers_of_the_messages_it_kept(proxy: Proxy) -> None:
    """Two turns of a session whose marker moves to the last message: the fitted prompt of
    each carries it on its last message only, as the client sent it."""
    system, messages = to_anthropic(agent_session(60))
    turn1 = [*messages, *tool_round(0, mark=True)]
    turn2 = [*messages, *tool_round(0), *tool_round(1, mark=True)]
    for turn in (turn1, turn2):
        r = httpx.post(
            f"{proxy.url}/v1/messages",
            headers={"x-api-key": proxy.key, "anthropic-version": "2023-06-01"},
            json={"model": proxy.model, "max_tokens": 64, "system": system, "messages": turn},
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-prefit-fit"] == "applied"
        sent = proxy.fake.received[-1].body["messages"]
        assert sent[-1] == turn[-1] and "cache_control" not in str(sent[:-1])


def test_the_message_that_lost_its_marker_converts_to_the_same_objects() -> None:
    """The last message, resent without its marker (a new object), converts to the objects
    it converted to; putting markers back uses the client's message as now sent."""
    conversions = Conversions()
    first = [{"role": "user", "content": TASK}, *tool_round(0, mark=True)]
    before = conversions.convert(first)
    resent = [*first[:2], *tool_round(0)[1:], *tool_round(1, mark=True)]
    after = conversions.convert(resent)
    assert after[2] is before[2]
    _, out = to_anthropic([m for g in after for m in g], sent=conversions.sent(resent))
    assert out == resent and all(a is b for a, b in zip(out, resent, strict=True))


@given(_conversation())
@settings(max_examples=150, deadline=None)
def test_conversions_convert_and_go_back_as_the_whole_transcript_does(
    conv: tuple[Any, list[dict[str, Any]]],
) -> None:
    """Converted by `Conversions` (markers left out) a transcript is `from_anthropic`'s of it
    unmarked; converted back from those objects it is exactly what the client sent."""
    system, msgs = conv
    conversions = Conversions()
    conversions.convert(msgs[:-1])
    groups = conversions.convert(msgs)  # the first messages remembered, the last one not
    converted = [m for g in groups for m in g]
    assert converted == from_anthropic(None, [unmarked(m) for m in msgs])
    head = [] if system is None else [{"role": "system", "content": system}]
    back = to_anthropic([*head, *converted], sent=conversions.sent(msgs))
    assert back == (system, msgs)


def test_adopted_objects_are_what_the_next_body_converts_to() -> None:
    """The stored conversation's equal objects, adopted, are the conversions the next body
    that resends those messages gets; and they convert back to the client's messages."""
    conversions = Conversions()
    first = [{"role": "user", "content": TASK}, *tool_round(0)]
    converted = [m for g in conversions.convert(first) for m in g]
    stored = [dict(m) for m in converted]
    conversions.adopt(first, stored)
    resent = [*first, *tool_round(1)]
    got = [m for g in conversions.convert(resent) for m in g]
    assert all(a is b for a, b in zip(got, stored, strict=False))
    back = to_anthropic(got, sent=conversions.sent(resent))[1]
    assert back == resent and all(a is b for a, b in zip(back, resent, strict=True))


def test_with_the_cache_off_markers_ride_in_the_conversion() -> None:
    """`PREFIT_PROXY_BODY_CACHE_MB=0`: nothing is remembered, the messages convert whole with
    their markers, and a prompt converted back carries them."""
    dialect = AnthropicDialect(Settings(proxy_body_cache_mb=0))
    given = [{"role": "user", "content": TASK}, *tool_round(0, mark=True)]
    messages, _ = dialect.transcript({"messages": given}, lambda m: m)
    assert messages == from_anthropic(None, given) and "cache_control" in str(messages)
    assert dialect.with_messages({"messages": given}, messages)["messages"] == given


def test_the_conversions_are_bounded_but_keep_the_newest() -> None:
    """Past `max_bytes` the oldest transcripts are forgotten; the newest is kept whatever
    its size, so its request still puts the client's markers back."""
    conversions = Conversions(max_bytes=1)
    first = [{"role": "user", "content": "other task"}, *tool_round(0, mark=True)]
    conversions.convert(first)
    given = [{"role": "user", "content": TASK}, *tool_round(0, mark=True)]
    converted = [m for g in conversions.convert(given) for m in g]
    assert conversions.sent(first)(converted, 0) is None
    assert to_anthropic(converted, sent=conversions.sent(given))[1] == given


def test_the_anthropic_tap_counts_cached_prompt_tokens() -> None:
    """message_start's input + cache read + cache creation tokens."""
    usage = {"input_tokens": 5, "cache_read_input_tokens": 70, "cache_creation_input_tokens": 25}
    start = (
        b"event: message_start\ndata: "
        + json.dumps({"type": "message_start", "message": {"usage": usage}}).encode()
        + b"\n\n"
    )
    tap = StartTap()
    assert tap.keep(start) and tap.prompt_tokens == 100
    assert AnthropicDialect(Settings()).prompt_tokens({"usage": usage}) == 100


def test_source_index_maps_a_converted_message_to_its_anthropic_message() -> None:
    """A user turn of two tool results and a text converts to three messages; the index of
    each maps back to that one turn, and what follows to its own message."""
    use = [{"type": "tool_use", "id": i, "name": "f", "input": {}} for i in ("a", "b")]
    results = [{"type": "tool_result", "tool_use_id": i} for i in ("a", "b")]
    given = [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": use},
        {"role": "user", "content": [*results, {"type": "text", "text": "more"}]},
        {"role": "assistant", "content": "done"},
    ]
    found = [source_index("sys", given, k) for k in range(7)]
    assert found == [None, 0, 1, 2, 2, 2, 3]
    assert source_index(None, given, 5) == 3
    assert source_index(None, given, None) is None
