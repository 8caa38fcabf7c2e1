"""ContextPolicy: thresholds, strategies in order, summaries from the book, errors."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.counting.calibration import CalibratedCounter, ScaledCounter
from shared.counting.counters import HeuristicCounter, TiktokenCounter
from shared.errors import (
    ConfigError,
    DoesNotFit,
    InvalidTranscript,
    RetryableLLMError,
    UnknownModel,
)
from shared.formats.anthropic import from_anthropic
from shared.formats.responses import from_responses, to_responses
from shared.hashing import prefix_hashes
from shared.messages import Message, groups
from shared.policy import ContextPolicy
from shared.strategies import DropOldest, Summarize
from shared.strategies.drop import drop_marker
from shared.summaries.book import SummaryBook, SummaryRecord
from shared.summaries.llm import Completion
from tests.builders import agent_chat
from tests.shared.generated import (
    REMINDER,
    reasoning_sessions,
    thinking_sessions,
    transcripts,
)
from tests.shared.invariants import (
    assert_uncuttable,
    check,
    check_reasoning,
    check_thinking,
)

pytestmark = pytest.mark.anyio

COUNTER = HeuristicCounter()


class CountingSummarizer:
    """A summarizer that records the ranges it was asked to fold."""

    name = "counting"

    def __init__(self) -> None:
        self.calls: list[int] = []

    async def summarize(
        self, previous: str | None, messages: Sequence[Message], *, max_tokens: int, index: str = ""
    ) -> Completion:
        self.calls.append(len(messages))
        return Completion(
            text=f"summary of {len(messages)} after {len(previous or '')}",
            input_tokens=10,
            output_tokens=5,
            cost=0.01,
        )


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(transcripts(), st.integers(1500, 40_000), st.sampled_from([1.0, 0.8, 0.5]))
async def test_invariants_on_generated_transcripts(
    msgs: list[Message], window: int, pressure: float
) -> None:
    """Any valid transcript fits, or raises DoesNotFit because what may never be cut (head,
    recent turns, tool specs) is over the budget by itself."""
    policy = ContextPolicy(window + 1024, counter=COUNTER, reserve_output=1024)
    try:
        out = await policy.prepare(msgs, pressure=pressure)
    except DoesNotFit as e:
        assert_uncuttable(e)
        return
    check(policy, msgs, out, counter=COUNTER, pressure=pressure)
    assert (await policy.prepare(msgs, pressure=pressure)).messages == out.messages


def two_runs_around_the_latest_request() -> list[Message]:
    """The case the property found (issue 17): head and recent turns fit a 1,500-token
    budget, but not with the latest request kept between two runs of dropped turns and the
    two markers standing for them (1,501 tokens)."""
    note: Message = {"role": "assistant", "content": [{"type": "text", "text": "x"}, TEXT_END]}
    asked: Message = {"role": "user", "content": [{"type": "text", "text": "x"}, TEXT_END]}
    asked["name"] = "customer"
    call = {
        "id": "call_0_0",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"cmd": "ls"}'},
    }
    tool_turn: list[Message] = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0_0", "content": "x"},
    ]
    last = [{"type": "text", "text": "00\U00010000" * 221}, TEXT_END]
    return [
        {"role": "user", "content": "0\x80" * 466},
        # the property's case had users here; answers keep the head rule's preamble (a user
        # message right before another) out of it, with the same counts
        *[{**asked, "role": "assistant"}] * 4,
        {"role": "user", "content": "x" * 524, "name": "customer"},
        *[note] * 5,
        *tool_turn,
        note,
        *tool_turn,
        note,
        {"role": "assistant", "content": last},
    ]


TEXT_END = {"type": "text", "text": ""}


async def test_the_latest_request_goes_before_a_refusal() -> None:
    """Over the budget only by what DropOldest kept as a courtesy (the latest request, two
    markers), the prompt drops the request, joins the runs behind one marker, and fits."""
    msgs = two_runs_around_the_latest_request()
    policy = ContextPolicy(1500 + 1024, counter=COUNTER, reserve_output=1024)
    out = await policy.prepare(msgs)
    assert out.report is not None
    applied = [a["strategy"] for a in out.report["applied"]]
    assert applied == ["DropOldest", "LastResortDropRequest"]
    assert out.report["applied"][-1]["messages"] == [5]
    assert msgs[5] not in out.messages
    assert sum(1 for m in out.messages if "were dropped here" in str(m["content"])) == 1
    assert out.report["tokens_after"] <= 1500
    check(policy, msgs, out, counter=COUNTER)


async def test_markers_go_before_a_refusal() -> None:
    """When head and recent turns fit only without the drop marker, the marker goes too."""
    msgs = agent_chat(30)
    head, tail = msgs[:2], msgs[-1:]  # keep_recent=1: the last group is one message
    fits = COUNTER.count([*head, *tail], (), None)
    assert COUNTER.count([*head, drop_marker(1, 1), *tail], (), None) > fits
    policy = ContextPolicy(fits, counter=COUNTER, reserve_output=0, keep_recent=1)
    out = await policy.prepare(msgs)
    assert out.report is not None
    assert out.report["applied"][-1]["strategy"] == "LastResortDropMarkers"
    assert out.messages == [*head, *tail]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(transcripts(max_groups=40), st.integers(2000, 20_000))
async def test_invariants_with_inline_summaries(msgs: list[Message], window: int) -> None:
    """With a summarizer, summaries replace the oldest turns and the invariants still hold."""
    policy = ContextPolicy(
        window + 1024, counter=COUNTER, reserve_output=1024, summarizer=CountingSummarizer()
    )
    try:
        out = await policy.prepare(msgs, book=SummaryBook())
    except DoesNotFit:
        return
    check(policy, msgs, out, counter=COUNTER)
    for record in out.new_summaries:
        assert record.prefix_hash == prefix_hashes(msgs[: record.upto])[-1]


async def test_unchanged_under_trigger() -> None:
    """At or under trigger x budget the transcript comes back as it was, with a report."""
    msgs = agent_chat(3)
    out = await ContextPolicy(100_000).prepare(msgs)
    assert out.messages == msgs
    assert out.report is not None and out.report["changed"] is False and out.report["applied"] == []


async def test_strategies_stop_once_under_target() -> None:
    """Cheap strategies come first; later ones do not run once the target is met."""
    msgs = agent_chat(40, size=9000)
    policy = ContextPolicy(60_000, counter=COUNTER)
    out = await policy.prepare(msgs)
    assert out.report is not None
    names = [a["strategy"] for a in out.report["applied"]]
    assert names[0] == "TruncateToolResults"
    assert "DropOldest" not in names or names[-1] == "DropOldest"
    assert out.report["tokens_after"] <= out.report["target_tokens"] or "DropOldest" in names
    assert all(a["saved"] > 0 for a in out.report["applied"])


async def test_drop_oldest_leaves_a_marker_and_keeps_head_and_tail() -> None:
    """DropOldest removes whole groups after the head and says so in one marker."""
    msgs = agent_chat(60)
    policy = ContextPolicy(8000, counter=COUNTER, reserve_output=1000, strategies=[DropOldest()])
    out = await policy.prepare(msgs)
    assert out.report is not None
    markers = [m for m in out.messages if "were dropped here" in str(m.get("content"))]
    assert len(markers) == 1 and out.report["dropped_groups"] > 0
    assert out.messages[:2] == msgs[:2] and out.messages[-3:] == msgs[-3:]
    assert out.report["tokens_after"] <= out.report["target_tokens"]


async def test_summary_from_book_is_used_and_reported() -> None:
    """A matching record replaces its range; the report names it."""
    msgs = agent_chat(40)
    upto = 2 + 3 * 20
    record = SummaryRecord(upto, prefix_hashes(msgs)[upto], "THE SUMMARY")
    policy = ContextPolicy(12_000, counter=COUNTER, strategies=[Summarize(), DropOldest()])
    out = await policy.prepare(msgs, book=SummaryBook([record]))
    assert out.report is not None
    assert out.report["summary"] == {
        "upto": upto,
        "prefix_hash": record.prefix_hash,
        "summarizer": "",
    }
    assert out.messages[2]["content"].endswith("THE SUMMARY")
    assert out.messages[3:6] == msgs[upto : upto + 3] or out.report["dropped_groups"] > 0


async def test_book_only_marks_stale_when_summary_is_due() -> None:
    """Without a summarizer, an over-target result after the book's record is reported stale."""
    msgs = agent_chat(80)
    policy = ContextPolicy(12_000, counter=COUNTER, strategies=[Summarize(), DropOldest()])
    out = await policy.prepare(msgs, book=SummaryBook())
    assert out.report is not None
    assert out.report["stale"] is True and out.report["dropped_groups"] > 0


async def test_inline_summary_is_incremental() -> None:
    """A second prepare folds the earlier record and summarizes only the new range."""
    summarizer = CountingSummarizer()
    policy = ContextPolicy(
        12_000, counter=COUNTER, summarizer=summarizer, strategies=[Summarize(), DropOldest()]
    )
    book = SummaryBook()
    msgs = agent_chat(60)
    first = await policy.prepare(msgs, book=book)
    assert (
        len(first.new_summaries) == 1
        and first.tokens_spent == 15
        and first.cost == pytest.approx(0.01)
    )
    upto = first.new_summaries[0].upto
    more = agent_chat(90)
    second = await policy.prepare(more, book=book)
    assert second.new_summaries and second.new_summaries[0].upto > upto
    assert sum(summarizer.calls) == second.new_summaries[0].upto - 2  # each message folded once


async def test_chunking_splits_long_ranges() -> None:
    """A range larger than chunk_tokens is summarized chunk by chunk."""
    summarizer = CountingSummarizer()
    strategy = Summarize(chunk_tokens=2000)
    policy = ContextPolicy(
        30_000, counter=COUNTER, summarizer=summarizer, strategies=[strategy, DropOldest()]
    )
    await policy.prepare(agent_chat(200), book=SummaryBook())
    assert len(summarizer.calls) > 3


async def test_does_not_fit_when_head_alone_is_too_big() -> None:
    """A head bigger than the budget raises DoesNotFit with the figures."""
    msgs = [
        {"role": "system", "content": "x" * 50_000},
        {"role": "user", "content": "hi"},
        *agent_chat(5)[2:],
    ]
    with pytest.raises(DoesNotFit) as err:
        await ContextPolicy(8000, counter=COUNTER, reserve_output=1000).prepare(msgs)
    assert err.value.budget == 7000 and err.value.head_tokens > 7000


async def test_pressure_forces_deeper_cuts() -> None:
    """pressure < 1 treats the estimate as too low and cuts further."""
    msgs = agent_chat(60)
    policy = ContextPolicy(16_000, counter=COUNTER, reserve_output=1000)
    loose = await policy.prepare(msgs)
    tight = await policy.prepare(msgs, pressure=0.5)
    assert COUNTER.count(tight.messages) < COUNTER.count(loose.messages)


async def test_bad_inputs_raise_typed_errors() -> None:
    """Malformed transcripts, pressures and windows raise precise typed errors."""
    policy = ContextPolicy(8000)
    with pytest.raises(InvalidTranscript, match="message 1: unknown role"):
        await policy.prepare([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])
    with pytest.raises(ConfigError, match="pressure"):
        await policy.prepare([], pressure=0)
    with pytest.raises(ConfigError):
        ContextPolicy(4000, reserve_output=4096)
    windows = {"gpt": 8000}
    hello = [{"role": "user", "content": "hello"}]
    with pytest.raises(UnknownModel, match="'other'"):
        await ContextPolicy(lambda m: windows[m or ""]).prepare(hello, model="other")
    with pytest.raises(InvalidTranscript, match="empty"):
        await policy.prepare([])


def test_keep_first_user_can_be_turned_off() -> None:
    """keep_first_user=False leaves only system/developer messages in the head."""
    msgs = agent_chat(2)
    assert ContextPolicy(8000).regions(msgs)[0] == 2
    assert ContextPolicy(8000, keep_first_user=False).regions(msgs)[0] == 1


def test_plan_summary_steps_the_cut() -> None:
    """Workers get a plan only when nearing; once its record exists, none until nearing again."""
    policy = ContextPolicy(12_000, counter=COUNTER, reserve_output=1000)
    assert policy.plan_summary(agent_chat(5), book=SummaryBook()) is None
    msgs = agent_chat(48)
    assert policy.state(policy.effective_tokens(msgs), None) != "under"
    plan = policy.plan_summary(msgs, book=SummaryBook())
    assert plan is not None and plan.previous is None and plan.start == 2
    book = SummaryBook([SummaryRecord(plan.cut, plan.prefix_hash, "s", tokens=20)])
    assert policy.plan_summary(msgs, book=book) is None
    assert (
        policy.plan_summary(agent_chat(49), book=book) is None
    )  # one more turn: same prefix, no new cut


async def test_a_record_under_the_trigger_is_served_alone() -> None:
    """[head][summary][rest] is sent as is when it fits: nothing else is cut, prefix stays."""
    msgs = agent_chat(50)
    upto = 2 + 3 * 30
    record = SummaryRecord(upto, prefix_hashes(msgs)[upto], "THE SUMMARY", tokens=10)
    policy = ContextPolicy(10_000, counter=COUNTER, reserve_output=1000)
    out = await policy.prepare(msgs, book=SummaryBook([record]), hashes=prefix_hashes(msgs))
    assert out.report is not None
    assert [a["strategy"] for a in out.report["applied"]] == ["Summarize"]
    assert out.messages[:2] == msgs[:2] and out.messages[3:] == msgs[upto:]
    assert out.messages[2]["content"].endswith("THE SUMMARY") and out.report["stale"] is False
    longer = await policy.prepare(agent_chat(51), book=SummaryBook([record]))
    assert longer.messages[:3] == out.messages[:3]  # byte-stable prefix across turns


async def test_records_made_when_planned_keep_prepare_fresh() -> None:
    """Growing turn by turn, writing each planned record at once: prepare is never stale."""
    policy = ContextPolicy(12_000, counter=COUNTER, reserve_output=1000)
    book = SummaryBook()
    written = []
    for n in range(1, 160):
        msgs = agent_chat(n)
        plan = policy.plan_summary(msgs, book=book)
        if plan is not None:
            text = f"summary up to {plan.cut}"
            book.add(
                SummaryRecord(
                    plan.cut,
                    plan.prefix_hash,
                    text,
                    tokens=COUNTER.count_message({"role": "user", "content": text}),
                )
            )
            written.append(plan.cut)
        out = await policy.prepare(msgs, book=book)
        assert out.report is not None
        assert out.report["stale"] is False, f"stale at {n} turns"
        assert out.report["dropped_groups"] == 0
    assert len(written) >= 3 and written == sorted(written)
    assert len(set(written)) == len(written)  # the cut moves in steps, never twice to one place


async def test_stale_when_the_worker_is_behind() -> None:
    """No record where one is due: stale, and a plan exists for the workers."""
    policy = ContextPolicy(
        12_000, counter=COUNTER, reserve_output=1000, strategies=[Summarize(), DropOldest()]
    )
    msgs = agent_chat(70)
    out = await policy.prepare(msgs, book=SummaryBook())
    assert out.report is not None
    assert out.report["stale"] is True
    assert policy.plan_summary(msgs, book=SummaryBook()) is not None


async def test_wrong_number_of_hashes_is_refused() -> None:
    """Caller-supplied prefix hashes must match the transcript."""
    with pytest.raises(ConfigError, match="prefix hashes"):
        await ContextPolicy(2000, reserve_output=100).prepare(agent_chat(20), hashes=["v1:x"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transcripts(max_groups=30), st.integers(0, 10_000), st.booleans())
async def test_a_record_is_used_only_for_its_own_prefix(
    msgs: list[Message], seed: int, matches: bool
) -> None:
    """A record whose prefix differs by content from the transcript's is never served."""
    policy = ContextPolicy(
        2000 + 1024, counter=COUNTER, reserve_output=1024, strategies=[Summarize(), DropOldest()]
    )
    head, tail = policy.regions(msgs)
    cuts = [a for a, _ in groups(msgs, head) if head < a <= tail]
    if not cuts:
        return
    upto = cuts[seed % len(cuts)]
    other = [*msgs[: upto - 1], {**msgs[upto - 1], "extra": "differs"}]
    source = msgs if matches else other
    record = SummaryRecord(upto, prefix_hashes(source[:upto])[-1], "STORED")
    try:
        out = await policy.prepare(msgs, book=SummaryBook([record]))
        assert out.report is not None
    except DoesNotFit:
        return
    used = any("STORED" in str(m.get("content")) for m in out.messages)
    assert used == (out.report["summary"] is not None)
    if not matches:
        assert not used


def _plain(turns: int, size: int, tail: list[int]) -> list[Message]:
    msgs: list[Message] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "task"},
    ]
    for i in range(turns):
        role = "assistant" if i % 2 == 0 else "user"
        msgs.append({"role": role, "content": f"turn {i} " + "t" * size})
    for i, chars in enumerate(tail):
        role = "assistant" if (turns + i) % 2 == 0 else "user"
        msgs.append({"role": role, "content": f"recent {i} " + "r" * chars})
    return msgs


async def test_not_stale_when_only_the_recent_turns_are_left() -> None:
    """A record reaching the protected recent turns is the best possible: over the trigger,
    yet nothing newer can be made, so the report is not stale and nothing is planned."""
    policy = ContextPolicy(12_000, counter=COUNTER, reserve_output=1_000)
    msgs = _plain(20, 400, [12_000, 12_000, 12_000])
    tail = policy.regions(msgs)[1]
    book = SummaryBook([SummaryRecord(tail, prefix_hashes(msgs)[tail], "all before the tail")])
    out = await policy.prepare(msgs, book=book)
    assert out.report is not None
    assert out.report["tokens_before"] > out.report["trigger_tokens"]
    assert out.report["summary"]["upto"] == tail
    assert out.report["stale"] is False
    assert policy.plan_summary(msgs, book=book) is None and not policy.summary_due(msgs, book=book)


async def test_not_stale_when_the_rest_already_fits_in_what_a_summary_keeps() -> None:
    """A large head and a small rest: a summary would keep all of it, so none is due."""
    policy = ContextPolicy(12_000, counter=COUNTER, reserve_output=1_000)
    msgs = _plain(6, 200, [300, 300, 300])
    msgs[0] = {"role": "system", "content": "rules " + "s" * 31_000}
    out = await policy.prepare(msgs, book=SummaryBook())
    assert out.report is not None
    assert out.report["tokens_before"] > out.report["trigger_tokens"]
    assert out.report["stale"] is False
    assert policy.plan_summary(msgs, book=SummaryBook()) is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transcripts(max_groups=30), st.integers(1_500, 20_000))
async def test_stale_only_when_a_record_is_due(msgs: list[Message], window: int) -> None:
    """Whenever prepare says stale, planning has a record for the workers to write."""
    policy = ContextPolicy(window + 1_000, counter=COUNTER, reserve_output=1_000)
    try:
        out = await policy.prepare(msgs, book=SummaryBook())
        assert out.report is not None
    except DoesNotFit:
        return
    if out.report["stale"]:
        assert policy.plan_summary(msgs, book=SummaryBook()) is not None


async def test_a_recounted_policy_prepares_as_a_new_one_would() -> None:
    """Copies measuring at other ratios share what the policy remembers, and each answers
    exactly as a policy built with its counter (the remembered sizes are uncalibrated)."""
    msgs = agent_chat(60)
    hashes = prefix_hashes(msgs)
    book = SummaryBook([SummaryRecord(122, hashes[122], "THE SUMMARY")])
    kept = ContextPolicy(12_000, counter=COUNTER)
    for turn, ratio in enumerate([1.0, 1.3, 0.7, 1.3, 1.0]):
        n = len(msgs) - 3 * (4 - turn)
        counter = ScaledCounter(COUNTER, ratio)
        for shelf in (None, book):
            kw: dict[str, Any] = {"book": shelf, "hashes": hashes[: n + 1]}
            got = await kept.recounted(counter).prepare(msgs[:n], conversation="c", **kw)
            fresh = await ContextPolicy(12_000, counter=counter).prepare(msgs[:n], **kw)
            assert (got.messages, got.report) == (fresh.messages, fresh.report)
    assert kept.counter is COUNTER


async def test_observe_refuses_what_was_not_a_request(tiktoken_dir: Path) -> None:
    """An empty or malformed `sent` is refused (typed) and leaves the ratio alone: a counter
    with per-request priming would otherwise read a request of no messages as 3x off."""
    policy = ContextPolicy(8000, counter=CalibratedCounter(TiktokenCounter(directory=tiktoken_dir)))
    for sent in ([], None, "hello", [{"role": "user", "content": 5}]):
        with pytest.raises(InvalidTranscript):
            policy.observe("m", sent, [], 100)  # type: ignore[arg-type]
    assert policy.counter.ratio("m") == 1.0  # type: ignore[attr-defined]


class WordySummarizer(CountingSummarizer):
    """A summarizer whose summaries are far over `max_tokens`."""

    async def summarize(
        self, previous: str | None, messages: Sequence[Message], *, max_tokens: int, index: str = ""
    ) -> Completion:
        await super().summarize(previous, messages, max_tokens=max_tokens)
        return Completion(text="word " * 3000, input_tokens=10, output_tokens=5, cost=0.01)


async def test_a_summary_too_big_for_the_window_is_left_out() -> None:
    """A record (or an inline summary) bigger than the cut-able rest of a small window does
    not make prepare refuse what fits without it: the turns are cut without the summary, and
    a summary paid for is still handed back."""
    msgs = agent_chat(40)
    upto = 2 + 3 * 20
    record = SummaryRecord(upto, prefix_hashes(msgs)[upto], "word " * 2000)
    policy = ContextPolicy(4_000, counter=COUNTER, reserve_output=1_000)
    out = await policy.prepare(msgs, book=SummaryBook([record]))
    assert out.report is not None
    assert out.report["summary"] is None and out.report["tokens_after"] <= 3_000
    check(policy, msgs, out, counter=COUNTER)
    inline = ContextPolicy(
        4_000, counter=COUNTER, reserve_output=1_000, summarizer=WordySummarizer()
    )
    out = await inline.prepare(msgs, book=SummaryBook())
    assert out.report is not None
    assert out.report["summary"] is None and out.new_summaries and out.cost > 0


class FailingSummarizer:
    """A summarizer whose provider is rate-limiting."""

    name = "failing"

    async def summarize(
        self, previous: str | None, messages: Sequence[Message], *, max_tokens: int, index: str = ""
    ) -> Completion:
        raise RetryableLLMError("429 from the summarizer's provider", retry_after=30)


async def test_a_failing_summarizer_does_not_fail_the_request() -> None:
    """A summarizer's 429 or timeout leaves the cut to the strategies after Summarize: the
    prompt fits, no summary, and the report says a summary is due (stale)."""
    msgs = agent_chat(60)
    policy = ContextPolicy(8_000, counter=COUNTER, summarizer=FailingSummarizer())
    out = await policy.prepare(msgs)
    assert out.report is not None
    check(policy, msgs, out, counter=COUNTER)
    assert out.report["summary"] is None and out.report["stale"] is True
    assert out.report["dropped_groups"] > 0 and not out.new_summaries


def test_a_window_that_is_not_a_number_is_a_config_error() -> None:
    """max_input_tokens that is neither an int nor a function, or a function answering
    something other than a number (None for a model it does not know), is a ConfigError."""
    for window in (None, "8000", 8000.5, True):
        with pytest.raises(ConfigError):
            ContextPolicy(window)  # type: ignore[arg-type]
    for answer in (None, "abc", float("nan"), True):
        with pytest.raises(ConfigError, match="must be a number"):
            ContextPolicy(lambda model, a=answer: a).budget("m")  # type: ignore[misc]
    assert ContextPolicy(lambda model: 8000.7).budget("m") == 8000 - 4096


async def test_legacy_function_calling_transcripts_are_fitted_with_pairs_kept() -> None:
    """A long transcript in OpenAI's legacy function-calling shape is prepared (not refused):
    dropping keeps each `function` result right after its `function_call`."""
    msgs: list[Message] = [{"role": "system", "content": "Be brief."}]
    for i in range(40):
        fc = {"name": "lookup", "arguments": f'{{"q": {i}}}'}
        msgs += [
            {"role": "user", "content": f"question {i} " + "q" * 300},
            {"role": "assistant", "content": None, "function_call": fc},
            {"role": "function", "name": "lookup", "content": f"answer {i} " + "a" * 600},
            {"role": "assistant", "content": f"reply {i}"},
        ]
    counter = HeuristicCounter()
    policy = ContextPolicy(4_000, counter=counter, reserve_output=500)
    out = await policy.prepare(msgs)
    assert counter.count(out.messages) <= policy.budget(None) < counter.count(msgs)
    for k, m in enumerate(out.messages):
        if m["role"] == "function":
            assert out.messages[k - 1].get("function_call") is not None
    assert out.messages[-4:] == msgs[-4:]


async def test_the_latest_request_stays_while_older_turns_are_in() -> None:
    """Strategies that drop nothing leave older turns in: a refusal, not a prompt without the
    user's latest request but with what came before it."""
    msgs = two_runs_around_the_latest_request()
    budget = COUNTER.count(msgs, (), None) - 100  # without the request (158 tokens) it fits
    policy = ContextPolicy(budget + 1024, counter=COUNTER, reserve_output=1024, strategies=[])
    with pytest.raises(DoesNotFit):
        await policy.prepare(msgs)


THINKING_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@THINKING_SETTINGS
@given(thinking_sessions(), st.integers(1500, 40_000), st.sampled_from([1.0, 0.8, 0.5]))
async def test_thinking_turns_are_kept_whole_at_every_window(
    session: tuple[Any, list[dict[str, Any]]], window: int, pressure: float
) -> None:
    """Tool loops with extended thinking, at any window: every thinking turn is kept whole
    or not at all, so Anthropic finds each assistant turn starting with its thinking block;
    every tool_use keeps its result, and the latest request kept is the person's."""
    msgs = from_anthropic(*session)
    policy = ContextPolicy(window + 1024, counter=COUNTER, reserve_output=1024)
    try:
        out = await policy.prepare(msgs, pressure=pressure)
    except DoesNotFit as e:
        assert_uncuttable(e)
        return
    check(policy, msgs, out, counter=COUNTER, pressure=pressure)
    check_thinking(msgs, out.messages)


@THINKING_SETTINGS
@given(thinking_sessions(), st.integers(1500, 20_000))
async def test_thinking_turns_are_summarized_whole(
    session: tuple[Any, list[dict[str, Any]]], window: int
) -> None:
    """With a summarizer, a summary ends where no thinking turn goes on past it."""
    msgs = from_anthropic(*session)
    policy = ContextPolicy(
        window + 1024, counter=COUNTER, reserve_output=1024, summarizer=CountingSummarizer()
    )
    try:
        out = await policy.prepare(msgs, book=SummaryBook())
    except DoesNotFit:
        return
    check(policy, msgs, out, counter=COUNTER)
    check_thinking(msgs, out.messages)


@THINKING_SETTINGS
@given(thinking_sessions(), st.integers(1500, 20_000))
async def test_a_record_ending_inside_a_thinking_turn_is_not_served(
    session: tuple[Any, list[dict[str, Any]]], window: int
) -> None:
    """A book with a record for every prefix (another conversation's, or one written before
    the rule): only those ending where a cut may fall are served."""
    msgs = from_anthropic(*session)
    hashes = prefix_hashes(msgs)
    book = SummaryBook([SummaryRecord(k, hashes[k], "done so far") for k in range(1, len(msgs))])
    policy = ContextPolicy(window + 1024, counter=COUNTER, reserve_output=1024)
    try:
        out = await policy.prepare(msgs, book=book)
    except DoesNotFit:
        return
    check_thinking(msgs, out.messages)


def issue_23_loop(steps: int) -> list[Message]:
    """The loop of issue 23: a task, then a tool loop whose first step alone carries the
    thinking block, longer than the recent turns kept."""
    out: list[dict[str, Any]] = [{"role": "user", "content": "Rename the cache module"}]
    for k in range(steps):
        use = {"type": "tool_use", "id": f"toolu_{k}", "name": "Bash", "input": {"k": k}}
        content: list[dict[str, Any]] = [{"type": "text", "text": f"step {k}"}, use]
        if k == 0:
            content.insert(0, {"type": "thinking", "thinking": "plan " * 50, "signature": "s"})
        out.append({"role": "assistant", "content": content})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": "x " * 900}
        out.append({"role": "user", "content": [result]})
    return from_anthropic("You are Claude Code.", out)


async def test_the_issue_23_loop_at_every_window() -> None:
    """Issue 23's request, at every window from the smallest that holds the recent turns:
    the loop's thinking step is never dropped while later steps stay (the whole loop is
    kept, its older results cleared)."""
    msgs = issue_23_loop(12)
    fitted = 0
    for window in range(2_000, 16_000, 250):
        policy = ContextPolicy(window + 1024, counter=COUNTER, reserve_output=1024)
        try:
            out = await policy.prepare(msgs)
        except DoesNotFit as e:
            assert_uncuttable(e)
            continue
        fitted += 1
        check(policy, msgs, out, counter=COUNTER)
        check_thinking(msgs, out.messages)
        assert msgs[2] in out.messages, "the loop's thinking step was dropped"
    assert fitted > 40


async def test_a_reminder_is_never_pinned_as_the_request() -> None:
    """DropOldest keeps the person's latest request between the head and the recent turns,
    not a lone `<system-reminder>` that came after it."""
    msgs: list[Message] = [{"role": "user", "content": "Fix the build"}]
    for k in range(20):
        msgs += [
            {"role": "assistant", "content": f"answer {k} " + "y" * 2000},
            {"role": "user", "content": f"follow-up {k}"},
        ]
    msgs += [
        {"role": "user", "content": REMINDER},
        *[{"role": "assistant", "content": f"note {k} " + "z" * 1500} for k in range(6)],
    ]
    policy = ContextPolicy(4_000 + 1024, counter=COUNTER, reserve_output=1024)
    out = await policy.prepare(msgs)
    check(policy, msgs, out, counter=COUNTER)
    assert {"role": "user", "content": "follow-up 19"} in out.messages
    assert {"role": "user", "content": REMINDER} not in out.messages


@THINKING_SETTINGS
@given(reasoning_sessions(), st.integers(1500, 20_000))
async def test_reasoning_items_keep_the_item_they_produced(
    items: list[dict[str, Any]], window: int
) -> None:
    """Responses sessions of a reasoning model: sent back, every reasoning item is followed
    by its call or message, and every output by its call, at any window."""
    msgs = from_responses("You are Codex.", items)
    policy = ContextPolicy(window + 1024, counter=COUNTER, reserve_output=1024)
    try:
        out = await policy.prepare(msgs)
    except DoesNotFit as e:
        assert_uncuttable(e)
        return
    check(policy, msgs, out, counter=COUNTER)
    check_reasoning(to_responses(out.messages))
