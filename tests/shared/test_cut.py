"""The ledger's cut gives exactly what running the default strategies gives, call after call."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.counting.calibration import CalibratedCounter
from shared.counting.counters import HeuristicCounter, TiktokenCounter
from shared.counting.protocol import TokenCounter
from shared.cut import TokenScale, default_steps
from shared.errors import ConfigError, DoesNotFit
from shared.formats.anthropic import from_anthropic
from shared.hashing import prefix_hashes
from shared.messages import Message, groups
from shared.policy import ContextPolicy, Prepared
from shared.strategies import ClearToolResults, DropOldest, Summarize, TruncateToolResults
from shared.strategies.work import MIN_PRESSURE
from shared.summaries.book import SummaryBook, SummaryRecord
from tests.conftest import load_transcript, long_session, needs_transcripts, transcript_files
from tests.shared.generated import thinking_sessions, transcripts

pytestmark = pytest.mark.anyio


class _Drop(DropOldest):
    """DropOldest under another type: a policy holding it runs the strategies themselves."""


def twins(window: int, counter: TokenCounter, **kw: Any) -> tuple[ContextPolicy, ContextPolicy]:
    """A policy on the ledger path and one running the same strategies, same settings."""
    truncate = kw.pop("truncate", {})
    clear = kw.pop("clear", {})

    def policy(drop: DropOldest) -> ContextPolicy:
        steps = [TruncateToolResults(**truncate), ClearToolResults(**clear), Summarize(), drop]
        return ContextPolicy(window, counter=counter, strategies=steps, **kw)

    fast, slow = policy(DropOldest()), policy(_Drop())
    assert default_steps(fast.strategies, fast.counter) is not None
    assert default_steps(slow.strategies, slow.counter) is None
    return fast, slow


async def run_or_refusal(
    policy: ContextPolicy, msgs: list[Message], **kw: Any
) -> Prepared | DoesNotFit:
    """What `policy.prepare(msgs)` returns, or the `DoesNotFit` it raises."""
    try:
        return await policy.prepare(msgs, **kw)
    except DoesNotFit as exc:
        return exc


async def assert_same(
    fast: ContextPolicy,
    slow: ContextPolicy,
    msgs: list[Message],
    **kw: Any,
) -> None:
    same(await run_or_refusal(fast, msgs, **kw), await run_or_refusal(slow, msgs, **kw))


def same(got: Prepared | DoesNotFit, expected: Prepared | DoesNotFit) -> None:
    if isinstance(expected, DoesNotFit):
        assert isinstance(got, DoesNotFit) and vars(got) == vars(expected)
        return
    assert isinstance(got, Prepared)
    assert got.report == expected.report
    assert got.messages == expected.messages


async def replay(
    fast: ContextPolicy,
    slow: ContextPolicy,
    msgs: list[Message],
    every: int = 1,
    **kw: Any,
) -> None:
    for _, end in groups(msgs)[::every]:
        await assert_same(fast, slow, msgs[:end], **kw)
    await assert_same(fast, slow, msgs, **kw)


@needs_transcripts
@pytest.mark.parametrize("path", transcript_files(), ids=lambda p: p.stem[:60])
async def test_real_transcripts_turn_by_turn_heuristic(path: Path) -> None:
    """Every turn of every real transcript, at four windows, same messages and report."""
    data = load_transcript(path)
    for window in (8_000, 16_000, 32_000, 128_000):
        fast, slow = twins(window, HeuristicCounter(), reserve_output=1024)
        await replay(fast, slow, data["messages"], tools=data.get("tools", ()))


@needs_transcripts
@pytest.mark.parametrize("path", transcript_files(), ids=lambda p: p.stem[:60])
async def test_real_transcripts_turn_by_turn_tiktoken(path: Path, tiktoken_dir: Path) -> None:
    """The same with exact counts, calibrated, under pressure."""
    data = load_transcript(path)
    counter = CalibratedCounter(TiktokenCounter(directory=tiktoken_dir))
    counter.observe("m", 1000, 1270)
    for window in (8_000, 32_000):
        fast, slow = twins(window, counter, reserve_output=1024)
        await replay(
            fast,
            slow,
            data["messages"],
            every=2,
            tools=data.get("tools", ()),
            model="m",
            pressure=0.8,
        )


@needs_transcripts
async def test_a_thousand_message_session() -> None:
    """The real transcripts chained into one long session: hundreds of groups dropped."""
    session = long_session(1000)
    fast, slow = twins(128_000, HeuristicCounter())
    await replay(fast, slow, session, every=7)


@settings(max_examples=60, deadline=None)
@given(thinking_sessions(), st.sampled_from([2_000, 6_000, 20_000]), st.integers(1, 4))
async def test_thinking_sessions_turn_by_turn(
    session: tuple[Any, list[dict[str, Any]]], window: int, keep_recent: int
) -> None:
    """Sessions with extended thinking, replayed message by message: the ledger keeps each
    thinking turn whole exactly as the strategies do."""
    msgs = from_anthropic(*session)
    fast, slow = twins(window, HeuristicCounter(), reserve_output=500, keep_recent=keep_recent)
    for end in range(1, len(msgs) + 1):
        await assert_same(fast, slow, msgs[:end])


settings_used = st.fixed_dictionaries(
    {
        "window": st.sampled_from([2_000, 6_000, 20_000]),
        "keep_recent": st.integers(1, 4),
        "keep_first_user": st.booleans(),
        "truncate": st.fixed_dictionaries(
            {
                "max_chars": st.sampled_from([10, 500, 8000]),
                "head": st.sampled_from([0.0, 0.7, 1.0]),
            }
        ),
        "clear": st.fixed_dictionaries(
            {
                "keep_last": st.integers(0, 5),
                "placeholder": st.sampled_from(
                    ["[gone]", "[tool result removed to save context]" * 3]
                ),
            }
        ),
        "pressure": st.sampled_from([1.0, 0.7]),
        "ratio": st.sampled_from([None, 0.6, 1.9]),
        "tools": st.sampled_from(
            [(), ({"type": "function", "function": {"name": "bash", "parameters": {}}},)]
        ),
        "book": st.booleans(),
        "scaled": st.booleans(),  # the ratio fixed for the call, as the API measures
    }
)


def counter_of(s: dict[str, Any]) -> TokenCounter:
    """A calibrated counter at the settings' ratio, or that ratio fixed (`scaled`)."""
    counter = CalibratedCounter(HeuristicCounter())
    if s["ratio"] is not None:
        counter.observe(None, 1000, int(1000 * s["ratio"]))
    return counter.scaled(None) if s["scaled"] else counter


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(transcripts(max_groups=25), settings_used)
async def test_generated_transcripts_with_any_settings(
    msgs: list[Message], s: dict[str, Any]
) -> None:
    """Generated transcripts, replayed, under every setting the ledger depends on."""
    fast, slow = twins(
        s["window"],
        counter_of(s),
        reserve_output=500,
        keep_recent=s["keep_recent"],
        keep_first_user=s["keep_first_user"],
        truncate=s["truncate"],
        clear=s["clear"],
    )
    kw = {
        "tools": s["tools"],
        "pressure": s["pressure"],
        "book": SummaryBook([]) if s["book"] else None,
    }
    await replay(fast, slow, msgs, **kw)


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(transcripts(max_groups=25), settings_used, st.integers(0, 10_000), st.sampled_from([1, 400]))
async def test_a_stored_summary_served_from_the_ledger(
    msgs: list[Message], s: dict[str, Any], seed: int, words: int
) -> None:
    """A book holding a record: served, or cut past, exactly as without the ledger."""
    ends = [end for _, end in groups(msgs)]
    upto = ends[seed % len(ends)]
    record = SummaryRecord(upto, prefix_hashes(msgs)[upto], "summary " * words)
    fast, slow = twins(
        s["window"], counter_of(s), reserve_output=500, keep_recent=s["keep_recent"],
        keep_first_user=s["keep_first_user"], truncate=s["truncate"], clear=s["clear"],
    )  # fmt: skip
    kw = {"tools": s["tools"], "pressure": s["pressure"], "book": SummaryBook([record])}
    await replay(fast, slow, msgs, **kw)


@pytest.mark.slow
@needs_transcripts
async def test_a_long_session_served_from_records() -> None:
    """The long session with a record every few groups, at 128k: the same prompt and report."""
    session = long_session(1000)
    hashes = prefix_hashes(session)
    ends = [end for _, end in groups(session)]
    book = SummaryBook([SummaryRecord(e, hashes[e], "summary " * 300) for e in ends[5::40]])
    fast, slow = twins(128_000, HeuristicCounter())
    await replay(fast, slow, session, every=5, book=book)


@needs_transcripts
async def test_frozen_snapshots_of_a_stored_conversation() -> None:
    """Snapshots as a store's cache hands them out (new lists, shared messages, frozen),
    named, with a record in the book: the same prompt and report as the strategies."""
    session = long_session(400)
    hashes = prefix_hashes(session)
    ends = [end for _, end in groups(session)]
    book = SummaryBook([SummaryRecord(ends[30], hashes[ends[30]], "summary " * 300)])
    fast, slow = twins(32_000, HeuristicCounter())
    for end in [*ends[::3], len(session)]:
        snapshot = session[:end]
        kw: dict[str, Any] = {"book": book, "hashes": hashes[: end + 1]}
        expected = await run_or_refusal(slow, snapshot, **kw)
        for _ in range(2):  # the first compares, the second recognises the snapshot
            same(
                await run_or_refusal(fast, snapshot, conversation=("t", "c"), frozen=True, **kw),
                expected,
            )


async def test_tool_results_in_the_head_are_truncated_too() -> None:
    """A tool result kept in the head (a small gap before the task) over `max_chars` is
    shortened, as the strategy shortens it, whether groups are dropped or not."""
    call = {"id": "c0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    opening: list[Message] = [
        {"role": "system", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": "x" * 11},
        {"role": "user", "content": "task"},
    ]
    for turns in (3, 40):
        msgs = list(opening)
        for i in range(turns):
            msgs += [{"role": "user", "content": f"q{i} " + "w " * 60}]
            msgs += [{"role": "assistant", "content": "a " * 60}]
        fast, slow = twins(
            2_000, HeuristicCounter(), reserve_output=500, truncate={"max_chars": 10}
        )
        await assert_same(fast, slow, msgs, pressure=0.3 if turns == 3 else 1.0)


async def test_a_message_changed_in_place_is_seen() -> None:
    """Mutating a message already taken in changes the next result, as it would the strategies'."""
    msgs = _agent(30)
    fast, slow = twins(4_000, HeuristicCounter(), reserve_output=500)
    await assert_same(fast, slow, msgs)
    msgs[-2]["content"] = "y" * 9000  # a recent tool result grows past max_chars
    await assert_same(fast, slow, msgs)
    msgs[3]["content"] = "short now"
    await assert_same(fast, slow, msgs)


async def test_changed_strategy_settings_rebuild_the_ledger() -> None:
    """A strategy's settings changed between calls are honoured on the next call."""
    msgs = _agent(30)
    fast, slow = twins(4_000, HeuristicCounter(), reserve_output=500)
    await assert_same(fast, slow, msgs)
    for policy in (fast, slow):
        policy.strategies[0].max_chars = 100  # type: ignore[attr-defined]
        policy.strategies[1].placeholder = "[x]"  # type: ignore[attr-defined]
    await assert_same(fast, slow, msgs)


def test_branches_of_one_conversation_from_many_threads() -> None:
    """Diverging continuations of one conversation, prepared at once, never mix."""
    base = _agent(20)
    branches = [[*base, *_agent(15, tag=f"b{b}")[2:]] for b in range(4)]
    fast, slow = twins(4_000, HeuristicCounter(), reserve_output=500)
    errors: list[BaseException] = []

    def work(branch: list[Message]) -> None:
        loop = asyncio.new_event_loop()
        try:
            for _, end in groups(branch)[len(groups(base)) - 2 :]:
                for _ in range(3):
                    loop.run_until_complete(assert_same(fast, slow, branch[:end]))
        except BaseException as exc:
            errors.append(exc)
        finally:
            loop.close()

    threads = [threading.Thread(target=work, args=(b,)) for b in branches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def _agent(turns: int, tag: str = "") -> list[Message]:
    msgs: list[Message] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
    ]
    for i in range(turns):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "sh", "arguments": "{}"}}
        msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        size = 9000 if i % 5 == 0 else 600
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"{tag}{i} " + "z" * size})
        if i % 4 == 3:
            msgs.append({"role": "user", "content": f"{tag} go on {i}"})
    return msgs


async def test_the_latest_request_kept_between_two_runs() -> None:
    """A follow-up request amid tool turns (some truncated, some cleared) is kept by both
    paths alike, turn by turn, with one marker on each side of it once both sides go."""
    follow_up: Message = {"role": "user", "content": "now also update the docs"}
    work = [m for m in _agent(37) if m["role"] != "user"]  # tool turns only
    msgs = [*_agent(12), follow_up, *work[1:]]
    split = 0
    for window in (3_000, 4_000, 8_000):
        fast, slow = twins(window, HeuristicCounter(), reserve_output=500)
        await replay(fast, slow, msgs)
        out = await run_or_refusal(fast, msgs)
        assert isinstance(out, Prepared) and follow_up in out.messages
        markers = [m for m in out.messages if "were dropped here" in str(m["content"])]
        split += len(markers) == 2
    assert split > 0


async def test_legacy_function_calls_and_images_decide_the_same() -> None:
    """Legacy `function_call`/`function` pairs and tool results with images (some at detail
    low) get the same messages and report (or refusal) on the ledger path as from the
    strategies, the last resort's image placeholders included."""
    msgs: list[Message] = [{"role": "system", "content": "Be brief."}]
    for i in range(30):
        fc = {"name": "lookup", "arguments": f'{{"q": {i}}}'}
        detail = "low" if i % 3 == 2 else "high"
        image = {
            "type": "image_url",
            "image_url": {"url": "https://x.test/a.png", "detail": detail},
        }
        call = {"id": f"c{i}", "type": "function", "function": {"name": "shot", "arguments": "{}"}}
        msgs += [
            {"role": "user", "content": f"question {i} " + "q" * 300},
            {"role": "assistant", "content": None, "function_call": fc},
            {"role": "function", "name": "lookup", "content": f"answer {i} " + "a" * 900},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {
                "role": "tool",
                "tool_call_id": f"c{i}",
                "content": [{"type": "text", "text": "s"}, image],
            },
            {"role": "assistant", "content": f"reply {i}"},
        ]
    for window in (1_800, 3_000, 12_000):  # at 1,800 the last resort replaces images
        fast, slow = twins(window, HeuristicCounter(), reserve_output=500)
        await replay(fast, slow, msgs, every=3)


@pytest.mark.parametrize("pressure", [5e-324, 1e-300, 0.0009, 0.0, -1.0, 1.5, float("nan")])
def test_a_token_scale_refuses_a_pressure_out_of_range(pressure: float) -> None:
    """5e-324 made every size infinite (OverflowError): now a typed `ConfigError`."""
    with pytest.raises(ConfigError, match="pressure must be within"):
        TokenScale(10, 1.0, pressure)


async def test_the_least_pressure_gives_readable_figures() -> None:
    """At `MIN_PRESSURE` a transcript that cannot fit is `DoesNotFit` with figures of a few
    digits (1e-300 once gave a 300-digit number); below it, `ConfigError`."""
    policy = ContextPolicy(8000)
    msgs: list[Message] = [{"role": "user", "content": "word " * 2000}]
    with pytest.raises(DoesNotFit) as caught:
        await policy.prepare(msgs, pressure=MIN_PRESSURE)
    assert 0 < caught.value.tokens < 10**8 and len(str(caught.value)) < 300
    with pytest.raises(ConfigError):
        await policy.prepare(msgs, pressure=1e-300)
