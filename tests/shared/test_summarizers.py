"""What a summarizer is shown of a range of messages."""

from __future__ import annotations

from shared.summarizers import render


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
