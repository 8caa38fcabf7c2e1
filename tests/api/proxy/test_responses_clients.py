"""Real Responses API clients pointed at prefit: the OpenAI Agents SDK and LangChain."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from langchain_openai import ChatOpenAI

from tests.api.conftest import RESERVE, WINDOW
from tests.api.proxy.conftest import TASK, Proxy, agent_session
from tests.api.proxy.test_responses import assert_fitted_faithfully, codex_session
from tests.fakeprovider import WORDS, Reply, prompt_tokens

pytestmark = pytest.mark.anyio

ANSWER = "".join(WORDS)


def agent(proxy: Proxy, client: openai.AsyncOpenAI, looked_up: list[str]) -> Agent[Any]:
    """An agent with one function tool, its model served through prefit by `client`."""

    @function_tool
    def lookup_cache(key: str) -> str:
        """Look a key up in the cache."""
        looked_up.append(key)
        return f"{key}: miss"

    model = OpenAIResponsesModel(model=proxy.model, openai_client=client)
    return Agent(name="fixer", instructions="Fix the cache.", model=model, tools=[lookup_cache])


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_agents_sdk_runner_with_a_function_tool_runs_through_prefit(
    proxy: Proxy, streamed: bool
) -> None:
    """A Runner calls its tool and answers, both turns fitted under the window: the long
    history it was given, then the call and its output, kept together."""
    set_tracing_disabled(True)
    history = codex_session(46)  # just over the window: kept small, the SDK runs in-process
    assert prompt_tokens("responses", {"input": history}) > WINDOW
    looked_up: list[str] = []
    proxy.fake.script(Reply(call=("lookup_cache", json.dumps({"key": "users:42"}))))
    # closed on this test's event loop: a client left to the garbage collector closes its
    # connections from whichever test's loop is running then, long after its own has closed
    async with openai.AsyncOpenAI(
        base_url=f"{proxy.url}/v1", api_key=proxy.key, max_retries=0
    ) as client:
        fixer = agent(proxy, client, looked_up)
        if streamed:
            result = Runner.run_streamed(fixer, history)
            async for _ in result.stream_events():
                pass
            answer = result.final_output
        else:
            answer = (await Runner.run(fixer, history)).final_output
    assert answer == ANSWER
    assert looked_up == ["users:42"]
    first, second = proxy.fake.received
    assert (first.status, second.status) == (200, 200)  # no overflow reached the provider
    for got in (first, second):
        assert got.body["instructions"] == "Fix the cache."
        assert got.body["tools"][0]["name"] == "lookup_cache"
        assert prompt_tokens("responses", got.body) <= WINDOW - RESERVE
        # the SDK re-serializes the items it was given: their keys come in its own order
        sent = got.body["input"][: len(got.body["input"]) - 2]
        assert_fitted_faithfully(sent, history, key_order=False)
    call, output = second.body["input"][-2:]
    assert call["type"] == "function_call" and output["type"] == "function_call_output"
    assert call["call_id"] == output["call_id"] and output["output"] == "users:42: miss"


def langchain(proxy: Proxy) -> ChatOpenAI:
    return ChatOpenAI(
        model=proxy.model,
        base_url=f"{proxy.url}/v1",
        api_key=proxy.key,  # type: ignore[arg-type]
        use_responses_api=True,
        max_retries=0,
    )


@pytest.mark.parametrize("streamed", [False, True])
def test_langchain_chat_openai_on_the_responses_api_is_fitted(proxy: Proxy, streamed: bool) -> None:
    """`ChatOpenAI(use_responses_api=True)` sends a long tool-calling conversation as
    Responses items; it reaches the provider fitted, pairs whole, and the answer comes back."""
    messages = agent_session(60)
    assert prompt_tokens("openai", {"messages": messages}) > WINDOW
    llm = langchain(proxy)
    if streamed:
        text = "".join(str(c.text) for c in llm.stream(messages))
    else:
        text = str(llm.invoke(messages).text)
    assert text == ANSWER
    [got] = proxy.fake.received
    assert got.status == 200 and got.path == "/v1/responses"
    sent = got.body["input"]
    assert prompt_tokens("responses", got.body) <= WINDOW - RESERVE
    assert any(i.get("role") == "user" and TASK in json.dumps(i) for i in sent[:2])
    calls = [i["call_id"] for i in sent if i.get("type") == "function_call"]
    answered = [i["call_id"] for i in sent if i.get("type") == "function_call_output"]
    assert calls == answered and calls[-1] == "call_59"
