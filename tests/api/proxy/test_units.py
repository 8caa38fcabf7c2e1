"""The proxy's pure parts: overflow figures and pressure, SSE events, taps, ids, callers."""

from __future__ import annotations

import json

import pytest

from api.auth import KeyRing
from api.proxy.anthropic import AnthropicDialect, StartTap, source_index
from api.proxy.caller import identify
from api.proxy.codec import dumps, loads
from api.proxy.identity import conversation_id, derived_id
from api.proxy.learned import LearnedWindows
from api.proxy.openai import OpenAIDialect, UsageTap
from api.proxy.overflow import (
    FLOOR,
    SHRINK,
    STEP,
    Overflow,
    anthropic_figures,
    next_pressure,
    openai_figures,
)
from api.proxy.streaming import Events
from shared.errors import InvalidRequest, Unauthorized
from shared.settings import Settings
from tests.builders import assistant, user


def test_openai_overflow_figures_are_read_from_each_wording() -> None:
    """The prompt count, the maximum and the completion's share, where stated."""
    assert openai_figures(
        "This model's maximum context length is 128000 tokens. However, your messages "
        "resulted in 130,500 tokens. Please reduce the length of the messages."
    ) == Overflow(130_500, 128_000, None)
    assert openai_figures(
        "This model's maximum context length is 8192 tokens. However, you requested 9000 "
        "tokens (8000 in the messages, 1000 in the completion)."
    ) == Overflow(8000, 8192, 1000)
    assert openai_figures(
        "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted "
        "in 300000 tokens."
    ) == Overflow(300_000, 272_000, None)
    assert openai_figures("context_length_exceeded") == Overflow()


def test_compatible_servers_overflow_wordings_are_recognised_with_their_figures() -> None:
    """Mistral's and Anthropic's wordings in an OpenAI error, and llama.cpp's (no figures)."""
    assert openai_figures(
        "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 "
        "maximum context length"
    ) == Overflow(40_000, 32_768, None)
    assert openai_figures("prompt is too long: 210000 tokens > 200000 maximum") == Overflow(
        210_000, 200_000, None
    )
    error = {"message": "the request exceeds the available context size", "code": None}
    assert OpenAIDialect().overflow(400, {"error": error}) == Overflow()
    error = {"message": "Rate limit reached for requests", "code": None}
    assert OpenAIDialect().overflow(400, {"error": error}) is None


def test_anthropic_overflow_figures_and_other_errors() -> None:
    """Both overflow wordings are read; any other 400 is no overflow."""
    assert anthropic_figures("prompt is too long: 208000 tokens > 200000 maximum") == Overflow(
        208_000, 200_000
    )
    assert anthropic_figures(
        "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, "
        "decrease input length or `max_tokens` and try again"
    ) == Overflow(188_240, 200_000, 21_333)
    assert anthropic_figures("max_tokens: Field required") is None


def test_the_pressure_follows_the_figures_and_always_drops() -> None:
    """allowed x E / N, with a margin; a fixed step without figures; never above 0.9 x."""
    figures = Overflow(prompt_tokens=150_000, limit=128_000)
    p = next_pressure(1.0, figures, estimated=100_000, budget=123_904, reserve=4096)
    assert p == pytest.approx(0.9 * 123_904 * 100_000 / (150_000 * 123_904))
    assert next_pressure(0.5, Overflow(), estimated=1, budget=1, reserve=0) == 0.5 * STEP
    generous = Overflow(prompt_tokens=10, limit=1_000_000)  # figures that say it fitted
    assert next_pressure(0.8, generous, estimated=10, budget=100, reserve=0) == 0.8 * SHRINK
    tiny = Overflow(prompt_tokens=10**9, limit=1000)
    assert next_pressure(1.0, tiny, estimated=10, budget=1000, reserve=0) == FLOOR


def test_events_are_cut_at_blank_lines_wherever_the_bytes_break() -> None:
    """Events split across chunks (and CRLF ones) come out whole and in order."""
    stream = b'data: {"a":1}\n\nevent: x\ndata: 2\r\n\r\ndata: [DONE]\n\n'
    for size in (1, 2, 3, 7, len(stream)):
        events = Events()
        out: list[bytes] = []
        for k in range(0, len(stream), size):
            out += events.feed(stream[k : k + size])
        assert out == [b'data: {"a":1}\n\n', b"event: x\ndata: 2\r\n\r\n", b"data: [DONE]\n\n"]
        assert events.rest() == b""


def _chunk(**fields: object) -> bytes:
    return b"data: " + json.dumps(fields).encode() + b"\n\n"


def test_the_openai_tap_reads_usage_and_drops_only_the_chunk_prefit_asked_for() -> None:
    """The usage-only chunk is read; dropped when prefit added it, kept when the client did."""
    usage = _chunk(choices=[], usage={"prompt_tokens": 42, "completion_tokens": 1})
    content = _chunk(choices=[{"delta": {"content": "hi"}}], usage=None)
    mine = UsageTap(strip=True)
    assert mine.keep(content) and not mine.keep(usage) and mine.keep(b"data: [DONE]\n\n")
    assert mine.prompt_tokens == 42
    theirs = UsageTap(strip=False)
    assert theirs.keep(usage) and theirs.prompt_tokens == 42


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
    assert AnthropicDialect().prompt_tokens({"usage": usage}) == 100


def test_streamed_openai_requests_ask_for_usage_once() -> None:
    """include_usage is added (other stream options kept) unless the client asked for it."""
    dialect = OpenAIDialect()
    body, strip = dialect.streamed({"stream": True, "stream_options": {"x": 1}})
    assert body == {"stream": True, "stream_options": {"x": 1, "include_usage": True}} and strip
    assert dialect.streamed({"stream_options": {"include_usage": True}}) == (None, False)


def test_the_derived_id_is_the_heads_and_the_tenants() -> None:
    """Same head and tenant: same id, turn after turn; another tenant or head: another."""
    head = [{"role": "system", "content": "s"}, user("task")]
    one = derived_id("a", head)
    assert derived_id("a", [*head, assistant("x"), user("y")]) == one
    assert derived_id("b", head) != one
    assert derived_id("a", [{"role": "system", "content": "s"}, user("other")]) != one
    assert conversation_id({"x-prefit-conversation": "chat-7"}, {}, "a", head) == "chat-7"
    with pytest.raises(InvalidRequest):
        conversation_id({"x-prefit-conversation": "has space"}, {}, "a", head)


KEYS = KeyRing.parse("acme:prefit-key")


def test_either_sdk_header_authenticates_and_the_prefit_key_is_never_forwarded() -> None:
    """Bearer or x-api-key name the tenant; without the opt-in nothing of the client's goes up."""
    off = Settings(proxy_forward_client_keys=False)
    assert identify({"authorization": "Bearer prefit-key"}, KEYS, off).tenant == "acme"
    assert identify({"x-api-key": "prefit-key"}, KEYS, off).tenant == "acme"
    both = {"x-prefit-api-key": "prefit-key", "authorization": "Bearer sk-own"}
    assert identify(both, KEYS, off).provider_auth == {}
    with pytest.raises(Unauthorized):
        identify({}, KEYS, off)
    with pytest.raises(Unauthorized):
        identify({"x-api-key": "nope"}, KEYS, off)


def test_the_opt_in_forwards_the_clients_own_provider_key_only() -> None:
    """With X-Prefit-Api-Key, the SDK's own key header goes upstream; prefit's never does."""
    on = Settings(proxy_forward_client_keys=True)
    both = {"x-prefit-api-key": "prefit-key", "authorization": "Bearer sk-own"}
    assert identify(both, KEYS, on).provider_auth == {"authorization": "Bearer sk-own"}
    same = {"x-prefit-api-key": "prefit-key", "x-api-key": "prefit-key"}
    assert identify(same, KEYS, on).provider_auth == {}
    plain = {"authorization": "Bearer prefit-key"}
    assert identify(plain, KEYS, on).provider_auth == {}  # the only key there is prefit's
    open_mode = identify({"x-api-key": "sk-own"}, KeyRing.parse(""), on)
    assert (open_mode.tenant, open_mode.provider_auth) == ("local", {"x-api-key": "sk-own"})


def test_bodies_are_read_exactly_even_where_orjson_would_round() -> None:
    """A field outside the transcript with an integer past 64 bits keeps every digit."""
    raw = b'{"model": "m", "seed": 123456789012345678901234567890, "messages": [], "x": NaN}'
    body = loads(raw)
    assert body["seed"] == 123456789012345678901234567890
    assert b"123456789012345678901234567890" in dumps(body)
    assert loads(b'{"a": [1, 2.5, "\\u00e9"]}') == {"a": [1, 2.5, "é"]}
    with pytest.raises(ValueError):
        loads(b"{not json")


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


def test_a_learned_window_is_the_tenants_own() -> None:
    """A window learned from one tenant's overflow fits that tenant's later requests only;
    another tenant's, and another app's, are still forwarded as unknown."""
    learned = LearnedWindows()
    window = learned.learn("alice", "m-x", Overflow(prompt_tokens=9_000, limit=8_192), 1_024)
    assert window is not None and window.max_input_tokens == 8_192
    assert learned.get("alice", "m-x") == window
    assert learned.get("bob", "m-x") is None
    assert LearnedWindows().get("alice", "m-x") is None
    assert learned.learn("alice", "m-y", Overflow(prompt_tokens=9_000), 1_024) is None


def test_legacy_functions_are_counted_as_the_tools_they_are() -> None:
    """The legacy `functions` parameter's specs take room in the prompt like `tools`."""
    fn = {"name": "lookup", "parameters": {"type": "object", "properties": {}}}
    tool = {"type": "function", "function": {"name": "other", "parameters": {}}}
    body = {"messages": [user("hi")], "tools": [tool], "functions": [fn]}
    _, specs = OpenAIDialect().transcript(body, lambda m: list(m))
    assert specs == [tool, {"type": "function", "function": fn}]
