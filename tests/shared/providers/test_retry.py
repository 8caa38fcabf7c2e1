"""Retries, waits and give-ups of the provider clients, over real HTTP and mock transports."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import httpx
import pytest
import structlog

from shared.errors import ConfigError, ContextLengthExceeded, LLMError, RetryableLLMError
from shared.providers import AnthropicClient, OpenAIClient, ProviderClient, RetryPolicy
from shared.providers.retry import parse_retry_after
from tests.fakellm import Failure, FakeLLM
from tests.shared.providers.helpers import MESSAGES, SleepRecorder, complete, make

pytestmark = pytest.mark.anyio

CLIENTS = [OpenAIClient, AnthropicClient]
SECRET = "the-launch-code-is-7781-do-not-leak"


def test_retry_after_ms_wins_over_retry_after() -> None:
    """`retry-after-ms` is read first, in milliseconds."""
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25


def test_retry_after_seconds() -> None:
    """`retry-after` in seconds, fractions allowed."""
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5


def test_retry_after_http_date() -> None:
    """An HTTP-date `retry-after` becomes the seconds from now until then."""
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    later = format_datetime(datetime(2025, 1, 1, 12, 0, 30, tzinfo=UTC), usegmt=True)
    assert parse_retry_after({"retry-after": later}, now=now.timestamp()) == 30.0


def test_retry_after_absent_or_garbage() -> None:
    """No header, or one that is neither a number nor a date, means no stated wait."""
    assert parse_retry_after({}) is None
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after-ms": "x"}) is None


def test_retry_after_in_the_past_is_zero() -> None:
    """Negative waits and past dates clamp to zero."""
    assert parse_retry_after({"retry-after": "-3"}) == 0.0
    past = "Wed, 01 Jan 2020 00:00:00 GMT"
    assert parse_retry_after({"retry-after": past}) == 0.0


def test_backoff_is_full_jitter_under_a_growing_cap() -> None:
    """The delay is rand() x min(max_delay, base x 2^(attempt-1))."""
    policy = RetryPolicy(base_delay_s=0.5, max_delay_s=3.0, max_inline_wait_s=10.0)
    assert [policy.backoff(a, lambda: 1.0) for a in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0]
    assert policy.backoff(3, lambda: 0.25) == 0.5
    assert policy.backoff(5, lambda: 0.0) == 0.0


def test_backoff_never_exceeds_the_inline_wait() -> None:
    """Backoff stays within max_inline_wait_s, so it never turns into a deferral."""
    policy = RetryPolicy(max_inline_wait_s=1.0, max_delay_s=30.0)
    assert policy.backoff(10, lambda: 1.0) == 1.0


def test_policy_rejects_zero_attempts() -> None:
    """At least one attempt is needed."""
    with pytest.raises(ConfigError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


@pytest.mark.parametrize("cls", CLIENTS)
async def test_429_honours_retry_after_ms(
    fake: FakeLLM, sleeper: SleepRecorder, cls: type[ProviderClient]
) -> None:
    """A 429 with retry-after-ms is retried after exactly that wait."""
    fake.script(Failure(429, headers={"retry-after-ms": "250"}))
    done = await complete(make(cls, fake.base_url, sleeper))
    assert sleeper.waits == [0.25]
    assert [c.status for c in fake.calls] == [429, 200]
    assert done.text.startswith("SUMMARY ")


async def test_429_honours_retry_after_seconds(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """A 429 with retry-after in seconds is retried after that wait."""
    fake.script(Failure(429, headers={"retry-after": "2"}))
    await complete(make(OpenAIClient, fake.base_url, sleeper))
    assert sleeper.waits == [2.0]
    assert len(fake.calls) == 2


@pytest.mark.parametrize("status", [500, 502, 503, 408, 409])
async def test_transient_status_then_success(
    fake: FakeLLM, sleeper: SleepRecorder, status: int
) -> None:
    """5xx, 408 and 409 are retried with jittered backoff, then the answer is returned."""
    fake.script(status)
    done = await complete(make(OpenAIClient, fake.base_url, sleeper))
    assert [c.status for c in fake.calls] == [status, 200]
    assert sleeper.waits == [0.25]  # rand 0.5 x base 0.5
    assert done.output_tokens > 0


async def test_529_overloaded_is_retried(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """Anthropic's 529 "overloaded" is retried like a 5xx."""
    fake.script(529, 529)
    done = await complete(make(AnthropicClient, fake.base_url, sleeper))
    assert [c.status for c in fake.calls] == [529, 529, 200]
    assert sleeper.waits == [0.25, 0.5]
    assert done.text.startswith("SUMMARY ")


@pytest.mark.parametrize("cls", CLIENTS)
@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_client_errors_are_not_retried(
    fake: FakeLLM, sleeper: SleepRecorder, cls: type[ProviderClient], status: int
) -> None:
    """400/401/403/404/422 fail at once, after exactly one call, with the status."""
    fake.script(status)
    with pytest.raises(LLMError) as info:
        await complete(make(cls, fake.base_url, sleeper))
    assert not isinstance(info.value, RetryableLLMError | ContextLengthExceeded)
    assert info.value.status == status
    assert f"HTTP {status}" in str(info.value)
    assert len(fake.calls) == 1
    assert sleeper.waits == []


async def test_401_message_points_at_the_api_key(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """An authentication failure says which setting to check."""
    fake.script(401)
    with pytest.raises(LLMError, match="PREFIT_SUMMARIZER_API_KEY"):
        await complete(make(OpenAIClient, fake.base_url, sleeper, api_key="sk-wrong"))


async def test_long_retry_after_is_deferred_not_slept(
    fake: FakeLLM, sleeper: SleepRecorder
) -> None:
    """A wait beyond max_inline_wait_s raises RetryableLLMError(retry_after) without sleeping."""
    fake.script(Failure(429, headers={"retry-after": "120"}))
    client = make(OpenAIClient, fake.base_url, sleeper, max_inline_wait_s=10.0)
    with pytest.raises(RetryableLLMError) as info:
        await complete(client)
    assert info.value.retry_after == 120.0
    assert info.value.status == 429
    assert sleeper.waits == []
    assert len(fake.calls) == 1


async def test_max_attempts_is_respected(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """After max_attempts failures the client gives up with a RetryableLLMError."""
    fake.script(500, 500, 500, 500, 500)
    with pytest.raises(RetryableLLMError, match="gave up after 3 attempts") as info:
        await complete(make(OpenAIClient, fake.base_url, sleeper, max_attempts=3))
    assert info.value.status == 500
    assert len(fake.calls) == 3
    assert len(sleeper.waits) == 2


async def test_give_up_carries_the_providers_last_wait(
    fake: FakeLLM, sleeper: SleepRecorder
) -> None:
    """The final RetryableLLMError passes on the wait the provider last asked for."""
    fake.script(
        Failure(429, headers={"retry-after": "1"}), Failure(429, headers={"retry-after": "3"})
    )
    with pytest.raises(RetryableLLMError) as info:
        await complete(make(OpenAIClient, fake.base_url, sleeper, max_attempts=2))
    assert info.value.retry_after == 3.0
    assert sleeper.waits == [1.0]


async def test_single_attempt_never_sleeps(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """max_attempts=1 means one call and no wait."""
    fake.script(503)
    with pytest.raises(RetryableLLMError):
        await complete(make(OpenAIClient, fake.base_url, sleeper, max_attempts=1))
    assert len(fake.calls) == 1
    assert sleeper.waits == []


async def test_read_timeout_is_retried_over_real_http(
    fake: FakeLLM, sleeper: SleepRecorder
) -> None:
    """An answer slower than the read timeout is abandoned and the request retried."""
    fake.script(Failure(200, delay=0.5))
    done = await complete(make(OpenAIClient, fake.base_url, sleeper, read_s=0.05))
    assert len(fake.calls) == 2
    assert sleeper.waits == [0.25]
    assert done.text.startswith("SUMMARY ")


@pytest.mark.parametrize(
    "exc", [httpx.ReadTimeout, httpx.ConnectTimeout, httpx.ConnectError, httpx.RemoteProtocolError]
)
async def test_transport_failures_are_retried(
    sleeper: SleepRecorder, exc: type[httpx.TransportError]
) -> None:
    """Timeouts, refused connections and dropped connections are retried."""
    seen: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(1)
        if len(seen) == 1:
            raise exc("boom", request=request)
        return httpx.Response(200, json=_openai_answer("ok"))

    client = make(
        OpenAIClient, "http://llm.test/v1", sleeper, transport=httpx.MockTransport(handler)
    )
    assert (await complete(client)).text == "ok"
    assert len(seen) == 2
    assert sleeper.waits == [0.25]


async def test_timeouts_until_max_attempts(sleeper: SleepRecorder) -> None:
    """Timeouts on every attempt end in RetryableLLMError naming the failure."""
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ReadTimeout("slow", request=request)

    client = make(
        OpenAIClient,
        "http://llm.test/v1",
        sleeper,
        transport=httpx.MockTransport(handler),
        max_attempts=2,
    )
    with pytest.raises(RetryableLLMError, match="ReadTimeout"):
        await complete(client)
    assert len(calls) == 2


async def test_unsendable_request_is_not_retried(sleeper: SleepRecorder) -> None:
    """A transport error that retrying cannot fix fails at once."""
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.UnsupportedProtocol("nope", request=request)

    client = make(
        OpenAIClient, "http://llm.test/v1", sleeper, transport=httpx.MockTransport(handler)
    )
    with pytest.raises(LLMError) as info:
        await complete(client)
    assert not isinstance(info.value, RetryableLLMError)
    assert len(calls) == 1


@pytest.mark.parametrize("cls", CLIENTS)
@pytest.mark.parametrize("status", [400, 401, 404, 422, 500, 429])
async def test_no_prompt_text_in_errors_or_logs(
    fake: FakeLLM, sleeper: SleepRecorder, cls: type[ProviderClient], status: int
) -> None:
    """Even when the provider echoes the prompt, neither the exception nor the logs carry it."""
    fake.script(*[Failure(status, echo_prompt=True)] * 2)
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": SECRET}]
    with structlog.testing.capture_logs() as logs, pytest.raises(LLMError) as info:
        await complete(make(cls, fake.base_url, sleeper, max_attempts=2), messages)
    assert SECRET in fake.calls[0].prompt  # the fake did echo it back
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)
    assert logs, "the client logged nothing: the check below would be vacuous"
    assert SECRET not in repr(logs)


@pytest.mark.parametrize("cls", CLIENTS)
async def test_no_prompt_text_in_context_length_errors(
    fake: FakeLLM, sleeper: SleepRecorder, cls: type[ProviderClient]
) -> None:
    """Context-length errors do not quote the prompt either."""
    fake.context_limit_chars = 10
    messages = [{"role": "user", "content": SECRET}]
    with pytest.raises(ContextLengthExceeded) as info:
        await complete(make(cls, fake.base_url, sleeper), messages)
    assert SECRET not in str(info.value)


async def test_request_carries_the_messages(fake: FakeLLM, sleeper: SleepRecorder) -> None:
    """Sanity check of the helper: the fake sees the test messages' text."""
    await complete(make(OpenAIClient, fake.base_url, sleeper))
    assert fake.calls[0].prompt == "\n".join(m["content"] for m in MESSAGES)


def _openai_answer(text: str) -> dict[str, object]:
    return {
        "model": "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
