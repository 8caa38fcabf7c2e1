"""An agent loop through the Anthropic SDK: a real transcript with extended thinking, resent
whole every turn, each request the provider gets checked as Anthropic would check it."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from shared.formats import from_anthropic, to_anthropic
from tests.api.proxy.conftest import Proxy, sent_fits, wait_for
from tests.api.proxy.test_openai import _summarize, stored_length
from tests.conftest import TRANSCRIPTS, load_transcript, needs_transcripts

pytestmark = pytest.mark.anyio

NAME = "mswea_gemini3pro__django__django-13933.json"  # 130 messages, 55 tool calls
THINKING = {"type": "enabled", "budget_tokens": 1024}
Block = dict[str, Any]


def with_thinking(name: str) -> tuple[Any, list[Block]]:
    """The transcript in Anthropic form, each assistant turn opening with a signed thinking."""
    system, messages = to_anthropic(load_transcript(TRANSCRIPTS / name)["messages"])
    for k, m in enumerate(messages):
        if m["role"] == "assistant":
            content = m["content"]
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
            thought = {"type": "thinking", "thinking": f"step {k}", "signature": f"sig-{k}=="}
            m["content"] = [thought, *blocks]
    return system, messages


def _blocks(m: Block, kind: str) -> list[Block]:
    content = m["content"]
    return [b for b in content if b["type"] == kind] if isinstance(content, list) else []


def faults(sent: list[Block], whole: list[Block]) -> list[str]:
    """What Anthropic would refuse in `sent`, or what prefit must not do to `whole`."""
    out = [] if sent[0] == whole[0] else ["the task is not first"]
    assistants = [m for m in whole if m["role"] == "assistant"]
    if assistants and assistants[-1] not in sent:
        out.append("the last assistant turn (its thinking) is gone")
    for i, m in enumerate(sent):
        uses = {b["id"] for b in _blocks(m, "tool_use")}
        if m["role"] == "assistant" and m not in assistants:
            out.append(f"{i}: an assistant turn was altered")
        if uses and i + 1 < len(sent):
            answered = {b["tool_use_id"] for b in _blocks(sent[i + 1], "tool_result")}
            if answered != uses:
                out.append(f"{i}: tool_use not answered in the next message")
        results = _blocks(m, "tool_result")
        before = {b["id"] for b in _blocks(sent[i - 1], "tool_use")} if i else set()
        if any(r["tool_use_id"] not in before for r in results):
            out.append(f"{i}: a tool_result answers no tool_use right before it")
        if results and m["content"][: len(results)] != results:
            out.append(f"{i}: tool_result blocks are not first")
    return out


@needs_transcripts
async def test_every_turn_of_a_thinking_agent_is_valid_and_uses_the_summary(proxy: Proxy) -> None:
    """Each request fits, keeps the task, pairs and every thinking block (signatures
    untouched, the current turn's kept); once the workers summarized, the summary is used."""
    system, messages = with_thinking(NAME)
    client = anthropic.Anthropic(base_url=proxy.url, api_key=proxy.key, max_retries=0)
    ends = [i + 1 for i, m in enumerate(messages[:-1]) if messages[i + 1]["role"] == "assistant"]
    summarized_at, found = None, []
    for turn, end in enumerate(ends):
        prefix = messages[:end]
        kw: dict[str, Any] = dict(model=proxy.model, max_tokens=512, thinking=THINKING)
        kw.update(system=system, messages=prefix)
        if turn % 3 == 0:
            with client.messages.stream(**kw) as stream:
                stream.get_final_message()
            headers = stream.response.headers
        else:
            raw = client.messages.with_raw_response.create(**kw)
            headers = raw.headers
        got = proxy.fake.received[-1]
        assert got.status == 200
        assert sent_fits(from_anthropic(got.body["system"], got.body["messages"]), [])
        found += [f"turn {turn}: {f}" for f in faults(got.body["messages"], prefix)]
        if (
            summarized_at is None
            and turn >= len(ends) // 2
            and headers["x-prefit-fit"] == "applied"
        ):
            conv, length = headers["x-prefit-conversation"], len(from_anthropic(system, prefix))
            wait_for(lambda: stored_length(proxy, conv) == length)  # noqa: B023
            await _summarize(proxy, proxy.tenant, conv, length)
            summarized_at = turn
        elif summarized_at is not None:
            assert "x-prefit-summary-upto" in headers, turn
    assert summarized_at is not None and summarized_at < len(ends) - 5
    assert found == []
