"""The head: the first user message and the person's task are kept wherever they are."""

from __future__ import annotations

from typing import Any

import pytest

from shared.counting.counters import HeuristicCounter
from shared.head import GAP_MAX_CHARS, head_of, opening_pair, task_digest
from shared.messages import Message
from shared.policy import ContextPolicy
from shared.strategies.drop import marker_counts
from shared.summaries.extractive import ExtractiveSummarizer
from tests.builders import tool_turn
from tests.conftest import load_transcript, needs_transcripts, transcript_files
from tests.shared import aider, preambles
from tests.shared.invariants import check

pytestmark = pytest.mark.anyio

COUNTER = HeuristicCounter()
GREETING: Message = {"role": "assistant", "content": "Hi! How can I help you today?"}
TASK: Message = {"role": "user", "content": "Cancel my flight HAT123 and refund it to my card."}


def lookup(i: int, output: str) -> list[Message]:
    """A reservation lookup (a tool call) and its result."""
    return tool_turn(f"call_{i}", "get_reservation", f'{{"id": "R{i}"}}', output)


def airline(turns: int, size: int = 900) -> list[Message]:
    """A customer-service shape: the agent greets, the user states the task, tools follow."""
    msgs: list[Message] = [GREETING, TASK]
    for i in range(turns):
        msgs += lookup(i, f"reservation R{i}: " + "x" * size)
        msgs.append({"role": "assistant", "content": f"I found reservation R{i}. " + "y" * 200})
        msgs.append({"role": "user", "content": f"ok, go on with step {i}"})
    return msgs


def test_task_after_a_greeting_is_in_the_head() -> None:
    """An assistant greeting before the task is kept with it as the head."""
    head = head_of([GREETING, TASK, GREETING])
    assert (head.lead, head.task, head.end, head.gap_kept) == (0, 1, 2, True)
    assert [head.protects(i) for i in range(3)] == [True, True, False]
    system = {"role": "system", "content": "be kind"}
    head = head_of([system, GREETING, TASK])
    assert (head.lead, head.task, head.end) == (1, 2, 3) and head.contiguous


def test_large_opening_is_cut_able_but_the_task_is_not() -> None:
    """An agent that worked before the user spoke: that work may go, the task stays."""
    msgs = [{"role": "system", "content": "s"}, *lookup(0, "z" * (GAP_MAX_CHARS + 1)), TASK]
    head = head_of(msgs)
    assert (head.lead, head.task, head.end, head.gap_kept) == (1, 3, 4, False)
    assert head.gap == (1, 3) and not head.contiguous
    assert [head.protects(i) for i in range(4)] == [True, False, False, True]


def test_no_user_message_yet_means_the_leading_messages() -> None:
    """Without a user message the head is the leading system messages, not final yet."""
    head = head_of([{"role": "system", "content": "s"}, GREETING])
    assert (head.end, head.task, head.final) == (1, None, False)
    assert head_of([TASK], keep_first_user=False).end == 0


@pytest.mark.parametrize("window", [4_000, 8_000, 16_000])
async def test_greeting_first_conversation_keeps_the_task_when_cut(window: int) -> None:
    """At small windows DropOldest cuts the middle, never the greeting or the task."""
    msgs = airline(80)
    policy = ContextPolicy(window, counter=COUNTER, reserve_output=512)
    out = await policy.prepare(msgs)
    assert out.report is not None
    assert out.report["dropped_groups"] > 0
    assert out.messages[:2] == [GREETING, TASK]
    assert out.report["head"] == {
        "end": 2, "first_user": 1, "task": 1, "leading": 0, "messages": 2, "gap_kept": True,
        "template_kept": None,
    }  # fmt: skip
    check(policy, msgs, out, counter=COUNTER)


async def test_a_large_opening_is_dropped_before_anything_else() -> None:
    """The oldest groups go first, those before the task included, each run with its marker."""
    opening = [m for i in range(3) for m in lookup(i, "w" * 1500)]
    msgs = [{"role": "system", "content": "s"}, *opening, TASK, *airline(30)[2:]]
    policy = ContextPolicy(6_000, counter=COUNTER, reserve_output=512)
    out = await policy.prepare(msgs)
    assert out.report is not None
    check(policy, msgs, out, counter=COUNTER)
    task_at = out.messages.index(TASK)
    before = out.messages[1:task_at]
    assert [marker_counts(m) for m in before] == [(6, 3)], "the opening is one dropped run"
    after = marker_counts(out.messages[task_at + 1])
    assert after is not None and after[1] > 0
    assert out.report["dropped_groups"] == 3 + after[1]
    assert out.report["head"]["gap_kept"] is False


@needs_transcripts
@pytest.mark.parametrize(
    "path", [p for p in transcript_files() if p.name.startswith("tau2")], ids=lambda p: p.stem
)
@pytest.mark.parametrize("window", [8_000, 16_000])
async def test_real_greeting_first_transcripts_keep_the_task(path: Any, window: int) -> None:
    """tau2-bench airline conversations (greeting first) keep their task at small windows."""
    msgs = load_transcript(path)["messages"]
    assert msgs[0]["role"] == "assistant" and msgs[1]["role"] == "user"
    policy = ContextPolicy(window, counter=COUNTER, reserve_output=1024)
    out = await policy.prepare(msgs)
    assert out.messages[:2] == msgs[:2]
    check(policy, msgs, out, counter=COUNTER)


TEMPLATE_TASK = "Add a --verbose flag to cli.py that logs each step"


def contains(msgs: list[Message], text: str) -> bool:
    """Whether a message of `msgs` starts with `text`."""
    return any(str(m.get("content", "")).startswith(text) for m in msgs)


def test_aider_task_is_found_behind_its_few_shot_exchange_at_every_turn() -> None:
    """aider's few-shot example and file pairs are template: the person's request is the task."""
    for msgs in aider.prompts(TEMPLATE_TASK, 6):
        head = head_of(msgs)
        assert head.task is not None and str(msgs[head.task]["content"]).startswith(TEMPLATE_TASK)
        assert (head.lead, head.first) == (1, 1)
        assert head.final == (head.task < len(msgs) - 1)  # the task's reply is in
        assert head.describe()["task"] == head.task


def test_aider_without_examples_keeps_its_task_at_every_turn() -> None:
    """With the examples in the system prompt, the task is the first user message from the
    third prompt on; at the second, the task is pinned as the first user message."""
    for step, msgs in enumerate(aider.prompts(TEMPLATE_TASK, 6, examples=False, reminder="sys")):
        head = head_of(msgs)
        at = next(i for i, m in enumerate(msgs) if str(m["content"]).startswith(TEMPLATE_TASK))
        assert head.protects(at)
        assert head.task == at or step == 1
        assert head.first == 1  # the first prompt's first user message is its files


def test_first_user_message_stays_pinned_with_the_task() -> None:
    """The example request (the first user message) and the task are both in the head."""
    msgs = aider.prompts(TEMPLATE_TASK, 3)[2]
    head = head_of(msgs)
    assert head.protects(1) and head.task == 7 and head.protects(7)
    assert head.template_kept and head.contiguous  # two short examples: kept whole
    first = aider.prompts(TEMPLATE_TASK, 1, file_chars=3000)[0]
    assert head_of(first).template == (2, 9)  # with the files the first prompt hands over


def test_preamble_and_acknowledged_context_are_not_the_task() -> None:
    """A user message right before another, or one answered "Ok.", is context, not the task."""
    env = {"role": "user", "content": "<environment_context>cwd=/repo</environment_context>"}
    ok = {"role": "assistant", "content": "Understood."}
    assert head_of([{"role": "system", "content": "s"}, env, TASK]).task == 2
    assert head_of([env, ok, TASK, GREETING]).task == 2
    asked = {"role": "assistant", "content": "Sure. Which flight?"}  # a question: no ack
    assert head_of([TASK, asked, {"role": "user", "content": "HAT123"}]).task == 0
    tools = [TASK, *lookup(0, "R0"), {"role": "user", "content": "next"}]
    assert head_of(tools).task == 0 and head_of(tools).final


def test_a_lone_greeting_waits_for_the_task() -> None:
    """A first request that stops at an acknowledged greeting is not final."""
    hello = {"role": "user", "content": "hello"}
    assert head_of([hello]).final is False
    assert head_of([hello, {"role": "assistant", "content": "Okay!"}]).final is False
    assert head_of([hello, {"role": "assistant", "content": "Okay!"}, TASK]).task == 2


@pytest.mark.parametrize("window", [3_000, 6_000])
async def test_aider_session_keeps_its_task_in_every_prompt(window: int) -> None:
    """Over a long aider session at small windows every prompt holds the person's task."""
    policy = ContextPolicy(window, counter=COUNTER, reserve_output=512)
    cut = 0
    for msgs in aider.prompts(TEMPLATE_TASK, 40):
        out = await policy.prepare(msgs)
        assert out.report is not None
        assert contains(out.messages, TEMPLATE_TASK)
        assert out.messages[1] == aider.EXAMPLES[0]  # the first user message, pinned as before
        check(policy, msgs, out, counter=COUNTER)
        cut += bool(out.report["changed"])
    assert cut > 20, "the windows are small enough to cut most prompts"


@needs_transcripts
@pytest.mark.parametrize("window", [8_000])
async def test_real_transcripts_behind_a_template_keep_their_task(window: int) -> None:
    """Real transcripts with a few-shot exchange put before their task keep that task."""
    policy = ContextPolicy(window, counter=COUNTER, reserve_output=1024)
    for path in transcript_files():
        original = load_transcript(path)["messages"]
        first = head_of(original).first
        if first is None:
            continue
        msgs = [*original[:first], *aider.EXAMPLES, *original[first:]]
        task, was = head_of(msgs).task, head_of(original).task
        assert task is not None and was is not None and msgs[task] is original[was], path.name
        out = await policy.prepare(msgs)
        assert msgs[task] in out.messages, path.name
        check(policy, msgs, out, counter=COUNTER)


@pytest.mark.parametrize("window", [6_000, 10_000])
async def test_aider_session_summarized_inline_keeps_its_task_and_first_request(
    window: int,
) -> None:
    """With summaries folded in as the session grows, every prompt still holds the task, and
    each summary the person's first request after it, verbatim."""
    policy = ContextPolicy(
        window, counter=COUNTER, reserve_output=512, summarizer=ExtractiveSummarizer()
    )
    summarized = 0
    for step, msgs in enumerate(aider.prompts(TEMPLATE_TASK, 30)):
        out = await policy.prepare(msgs)
        assert contains(out.messages, TEMPLATE_TASK), step
        assert out.messages[-1] == msgs[-1]
        summary = next((m for m in out.messages if contains([m], "[Summary of messages")), None)
        if summary is not None:
            summarized += 1
            assert aider.request(1, TEMPLATE_TASK) in str(summary["content"]), step
    assert summarized > 10


def test_a_learned_preamble_moves_the_task_to_the_next_request() -> None:
    """Given the opening's key as a preamble, the task is the next user message; the opening
    stays in the head; other keys change nothing."""
    msgs = preambles.prompts("Port the CLI to click", 4)[3]
    plain = head_of(msgs)
    assert plain.task == 1 and plain.final
    key = task_digest(msgs[1])
    head = head_of(msgs, preambles=frozenset({key}))
    assert head.task == 3 and head.final and head.protects(1) and head.protects(3)
    assert head_of(msgs, preambles=frozenset({task_digest(msgs[3])})) == plain
    assert opening_pair(msgs) == (key, task_digest(msgs[3]))
    assert opening_pair(preambles.opened("x")[:2]) is None  # no follow-up yet: nothing to learn


def test_message_keys_ignore_moved_markers_and_an_appended_reminder() -> None:
    """A message's key is the same however a client marks it or appends a reminder to it."""
    text = {"role": "user", "content": [{"type": "text", "text": "Port the CLI"}]}
    marked = {"role": "user", "content": [{**text["content"][0], "cache_control": {"t": 1}}]}
    reminded = {"role": "user", "content": "Port the CLI\n\n# Rules: use blocks"}
    assert task_digest(text) == task_digest(marked)
    assert task_digest(reminded) == task_digest({"role": "user", "content": "Port the CLI"})
    assert task_digest(text) != task_digest({"role": "user", "content": "Port the CL"})


def test_an_unconfirmed_few_shot_close_offers_the_first_user_message() -> None:
    """aider with its examples in the system prompt: at the second prompt the note reads as a
    few-shot close, and `note_task` names the first user message (the session's task)."""
    prompts = aider.prompts(TEMPLATE_TASK, 4, examples=False)
    second = head_of(prompts[1])
    assert second.note_task == 1 and second.task != 1
    assert [head_of(p).note_task for k, p in enumerate(prompts) if k != 1] == [None] * 3
    confirmed = head_of(aider.prompts(TEMPLATE_TASK, 2)[1])  # the examples as messages
    assert confirmed.note_task is None and confirmed.final


RUN_REQUEST = "Help me get rid of the build warnings in this C project; I will paste each log."


def test_a_request_acknowledged_in_a_large_template_is_kept_with_the_head() -> None:
    """aider's `/run` session: the person's request, answered "Understood...", falls in a
    template too large to keep; the head keeps it, and the template around it stays cut-able."""
    msgs = aider.run_prompts(RUN_REQUEST, 4)[3]
    head = head_of(msgs)
    at = msgs.index({"role": "user", "content": RUN_REQUEST})
    assert head.task is not None and at < head.task and not head.template_kept
    assert head.requests == (at,) and head.protects(at)
    assert head.cuts == ((head.first + 1, at), (at + 1, head.task))
    assert not head.protects(at + 2)  # the build log handed over after it
    assert head.size() == head.lead + 3 and head.describe()["messages"] == head.size()
    plain = head_of(aider.prompts(TEMPLATE_TASK, 1, file_chars=3000)[0])
    assert plain.requests == () and plain.cuts == ((2, 9),)  # a file listing is no request


@pytest.mark.parametrize("window", [8_000, 16_000])
@pytest.mark.parametrize("summarize", [False, True])
async def test_aider_run_session_keeps_the_persons_request_in_every_prompt(
    window: int, summarize: bool
) -> None:
    """40 `/run` logs and questions after a request answered "Understood. Send me the first
    build log.": at small windows, summarized or not, every prompt holds that request, while
    the large repository map handed over before it in the template is cut."""
    summarizer = ExtractiveSummarizer() if summarize else None
    policy = ContextPolicy(window, counter=COUNTER, reserve_output=512, summarizer=summarizer)
    cut = map_cut = 0
    for step, msgs in enumerate(aider.run_prompts(RUN_REQUEST, 41, map_chars=4000)):
        out = await policy.prepare(msgs)
        assert out.report is not None
        assert contains(out.messages, RUN_REQUEST), step
        check(policy, msgs, out, counter=COUNTER)
        cut += bool(out.report["changed"])
        map_cut += msgs[7] not in out.messages  # the repository map, handed over
    assert cut > 20 and map_cut > 10, (cut, map_cut)
