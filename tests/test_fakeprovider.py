"""The fake provider refuses what the real ones refuse, with their messages, and takes time."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import openai
import pytest

from tests.api.server import serve
from tests.fakeprovider import (
    FakeProvider,
    Pace,
    anthropic_refusal,
    chat_refusal,
    responses_refusal,
)

THINKING = {"type": "enabled", "budget_tokens": 2_000}


def use(k: str, *, thinking: bool = False, text: str = "checking") -> dict[str, Any]:
    """An Anthropic assistant step: (thinking,) text, tool_use `k`."""
    blocks: list[dict[str, Any]] = []
    if thinking:
        blocks.append({"type": "thinking", "thinking": "hmm", "signature": "sig"})
    blocks += [
        {"type": "text", "text": text},
        {"type": "tool_use", "id": k, "name": "bash", "input": {}},
    ]
    return {"role": "assistant", "content": blocks}


def answer(*ids: str) -> dict[str, Any]:
    results = [{"type": "tool_result", "tool_use_id": k, "content": "ok"} for k in ids]
    return {"role": "user", "content": results}


def ask(text: str = "fix the bug") -> dict[str, Any]:
    return {"role": "user", "content": text}


def refused(found: dict[str, Any] | None) -> str:
    assert found is not None
    return str(found["error"]["message"])


def test_an_anthropic_tool_use_must_be_answered_in_the_next_message() -> None:
    """A tool_use whose result is not in the next message: Anthropic's 400."""
    body = {"messages": [ask(), use("a"), ask("go on")]}
    assert refused(anthropic_refusal(body)) == (
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately "
        "after: a. Each `tool_use` block must have a corresponding `tool_result` block in "
        "the next message."
    )
    assert anthropic_refusal({"messages": [ask(), use("a"), answer("a")]}) is None


def test_an_anthropic_tool_result_must_answer_the_message_before() -> None:
    """A tool_result answering no tool_use of the message before it: refused."""
    body = {"messages": [ask(), answer("a")]}
    assert refused(anthropic_refusal(body)).startswith(
        "messages.1.content.0: unexpected `tool_use_id` found in `tool_result` blocks: a."
    )


def test_with_thinking_a_running_tool_loop_starts_with_its_thinking_block() -> None:
    """The rule of issue 23: the turn's first assistant message dropped, a later step kept."""
    whole = [ask(), use("a", thinking=True), answer("a"), use("b"), answer("b")]
    assert anthropic_refusal({"messages": whole, "thinking": THINKING}) is None
    cut = [ask(), ask("[2 earlier messages were dropped here]"), use("b"), answer("b")]
    message = refused(anthropic_refusal({"messages": cut, "thinking": THINKING}))
    assert message.startswith(
        "messages.2.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
        "`text`. When `thinking` is enabled, a final `assistant` message must start with a "
        "thinking block"
    )
    assert anthropic_refusal({"messages": cut}) is None  # thinking off: no such rule
    # a new turn: earlier turns' thinking may be left out
    later = [*cut, {"role": "assistant", "content": "done"}, ask("thanks, now the tests")]
    assert anthropic_refusal({"messages": later, "thinking": THINKING}) is None


def test_thinking_blocks_come_first_in_their_message() -> None:
    """An assistant message holding thinking starts with it."""
    step = use("a", thinking=True)
    step["content"] = step["content"][1:] + step["content"][:1]
    body = {"messages": [ask(), step, answer("a")], "thinking": THINKING}
    message = refused(anthropic_refusal(body))
    assert "the first block must be thinking or redacted_thinking. Found text." in message


def test_at_most_four_cache_breakpoints_and_no_empty_text() -> None:
    """Five cache breakpoints, an empty or blank text block, an empty message: refused."""
    mark = {"cache_control": {"type": "ephemeral"}}
    system = [{"type": "text", "text": "rules", **mark}] * 3
    body = {
        "system": system,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a", **mark}] * 2}],
    }
    assert refused(anthropic_refusal(body)) == (
        "A maximum of 4 blocks with cache_control may be provided. Found 5."
    )
    empty = {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]}
    assert refused(anthropic_refusal(empty)) == "messages: text content blocks must be non-empty"
    blank = {"messages": [{"role": "user", "content": [{"type": "text", "text": "  "}]}]}
    assert "non-whitespace" in refused(anthropic_refusal(blank))
    nothing = {"messages": [ask(""), {"role": "assistant", "content": "x"}]}
    assert refused(anthropic_refusal(nothing)).startswith("messages.0: all messages must")


def test_the_prompt_and_the_reply_asked_must_fit_the_window() -> None:
    """prompt + max_tokens over the window: the providers' overflow messages, with figures."""
    body = {"messages": [ask("word " * 400)], "max_tokens": 64_000}
    message = refused(anthropic_refusal(body, limit=16_000))
    assert message.startswith("input length and `max_tokens` exceed context limit: ")
    assert message.split(": ", 1)[1].split(",")[0].endswith("+ 64000 > 16000")
    chat = {"messages": [ask("word " * 400)], "max_completion_tokens": 64_000}
    assert "in the completion)" in refused(chat_refusal(chat, limit=16_000))


def test_openai_tool_calls_are_each_answered_after_their_message() -> None:
    """Every tool_call_id answered by a tool message right after its assistant message."""
    call = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}, {"id": "c2"}]}
    tool = {"role": "tool", "tool_call_id": "c1", "content": "ok"}
    message = refused(chat_refusal({"messages": [ask(), call, tool, ask("next")]}))
    assert message.endswith("The following tool_call_ids did not have response messages: c2")
    stray = refused(chat_refusal({"messages": [ask(), tool]}))
    assert stray.startswith("Invalid parameter: messages with role 'tool' must be a response")
    both = {**tool, "tool_call_id": "c2"}
    assert chat_refusal({"messages": [ask(), call, tool, both, ask("next")]}) is None


def test_responses_reasoning_items_and_function_call_outputs_keep_their_partners() -> None:
    """A reasoning item needs its following item; a call and its output each other."""
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    call = {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    user = {"role": "user", "content": "go"}
    assert responses_refusal({"input": [user, reasoning, call, output]}) is None
    lone = refused(responses_refusal({"input": [user, reasoning, user]}))
    assert (
        lone == "Item 'rs_1' of type 'reasoning' was provided without its required following item."
    )
    orphan = refused(responses_refusal({"input": [user, output]}))
    assert orphan == "No tool call found for function call output with call_id c1."
    unanswered = refused(responses_refusal({"input": [user, call, user]}))
    assert unanswered == "No tool output found for function call c1."
    stateful = {"input": [output], "previous_response_id": "resp_1"}
    assert responses_refusal(stateful) is None  # its call is in the stored response


def test_over_http_the_sdks_raise_the_providers_errors_and_answers_take_their_time() -> None:
    """The refusal reaches the SDK as the provider's 400; an answer comes after `pace`."""
    fake = FakeProvider(pace=Pace(headers=0.3))
    with serve(fake.app) as url:
        client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as error:
            client.messages.create(
                model="m",
                max_tokens=100,
                messages=[ask(), use("a"), ask("go on")],  # type: ignore[list-item]
            )
        assert "`tool_use` ids were found without `tool_result` blocks" in str(error.value)
        started = time.monotonic()
        chat = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
        chat.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert time.monotonic() - started >= 0.3
    assert [r.status for r in fake.received] == [400, 200]
    assert fake.received[0].error.startswith("messages.1: `tool_use` ids")
