"""What a summarizer is shown of a range of messages, and what it is asked to keep."""

from __future__ import annotations

from shared.summaries.summarizers import build_prompt, render
from tests.shared import aider


def test_a_legacy_function_call_is_shown_like_a_tool_call() -> None:
    """An assistant's legacy `function_call` appears as a call with its arguments, and the
    `function` result that answers it as that role's text, so a summary can mention both."""
    fc = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    text = render(
        [
            {"role": "assistant", "content": None, "function_call": fc},
            {"role": "function", "name": "get_weather", "content": "21 degrees"},
        ]
    )
    assert '[calls get_weather({"city": "Paris"})]' in text
    assert "function:\n21 degrees" in text


def test_the_prompt_asks_for_the_persons_messages_verbatim_first_and_latest_always() -> None:
    """The summarizer is told to quote the user's messages, never to drop the first or the
    latest, and is shown aider's acknowledged file listing as context, not as a request."""
    prompt = build_prompt("User messages:\n- Port utils.py", aider.edit_turns(), 500)
    assert "quote them verbatim" in prompt and "first and the latest" in prompt
    assert "user:\nRename foo to bar in a.py" in prompt
    assert "user:\nNow run the tests" in prompt
    assert "user (context handed over):\nI have *added these files" in prompt
    assert "- Port utils.py" in prompt  # the previous summary's quotes are folded in
